"""Which processes run a multi-process job: the script launcher (the user's program started
again as the other ranks, up for the rest of the script) and the spawn launcher (new workers
per stage, for interactive use), with real gloo processes of two ranks.

The jobs are the script ``tests/_launcher_script.py`` (``fit``, then ``validate`` twice, on one
trainer), run as a program, run through ``python -c`` (no script file), run with rank 0
killed half-way, with every rank failing at once, and with rank 1 failing in the script between
two stages and after the last. They are started together up front by
the ``jobs`` fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ptrain.errors import ConfigError
from ptrain.script_launch import relaunch_command
from tests.conftest import REPO
from tests._campaigns import JOB_MODULES
from tests._subprocess_jobs import launcher_free_env

SCRIPT = REPO / "tests" / "_launcher_script.py"
pytestmark = [pytest.mark.slow, JOB_MODULES]


def run(argv: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, env=launcher_free_env(), capture_output=True, text=True,
                          timeout=timeout)


def detail(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in out.glob("[0-9]*.json")]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("launchers")
    interactive = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
                   f"from tests._launcher_script import main; main({str(root / 'c')!r})")
    argvs = {
        "script": [sys.executable, str(SCRIPT), str(root / "script")],
        "spawn": [sys.executable, str(SCRIPT), str(root / "spawn"), "--launcher", "spawn"],
        "c": [sys.executable, "-c", interactive],
        "killed": [sys.executable, str(SCRIPT), str(root / "killed"), "--kill-rank-zero"],
        "every-rank-fails": [sys.executable, str(SCRIPT), str(root / "every-rank-fails"),
                             "--fail-every-rank"],
        **{f"rank-one-fails-{when}": [sys.executable, str(SCRIPT),
                                      str(root / f"rank-one-fails-{when}"),
                                      "--rank-one-fails-outside-a-stage", when]
           for when in ("between", "after")},
        "rank-zero-fails-alone": [sys.executable, str(SCRIPT), str(root / "rank-zero-fails-alone"),
                                  "--rank-zero-fails-alone"],
    }
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(run, argv) for name, argv in argvs.items()}
        results = {name: (future.result(), root / name) for name, future in futures.items()}
    return results


def test_later_stages_run_in_the_processes_of_the_first(jobs):
    proc, out = jobs["script"]
    assert proc.returncode == 0, detail(proc)
    result = json.loads((out / "result.json").read_text())
    ran = records(out)
    assert sorted(r["rank"] for r in ran) == [0, 1]  # two processes in all, for three stages
    rank0 = next(r for r in ran if r["rank"] == 0)
    rank1 = next(r for r in ran if r["rank"] == 1)
    assert rank0["pid"] == result["pid"]  # the script's own process is rank 0
    assert rank1["ppid"] == result["pid"]  # and it started rank 1
    for record in ran:
        assert [s["stage"] for s in record["stages"]] == ["fit", "validate", "validate"]


def test_the_script_launcher_gives_the_spawn_launchers_results(jobs):
    (script, script_out), (spawn, spawn_out) = jobs["script"], jobs["spawn"]
    assert script.returncode == 0, detail(script)
    assert spawn.returncode == 0, detail(spawn)
    got = json.loads((script_out / "result.json").read_text())
    want = json.loads((spawn_out / "result.json").read_text())
    assert got["validate"] == want["validate"]
    assert got["weights"] == want["weights"]
    # the spawn launcher started new workers for each stage: six worker records, none rank 0's
    # launching process
    spawned = records(spawn_out)
    assert len(spawned) == 6 and want["pid"] not in {r["pid"] for r in spawned}


def test_a_call_without_a_script_file_uses_the_spawn_launcher(jobs):
    proc, out = jobs["c"]
    assert proc.returncode == 0, detail(proc)
    result = json.loads((out / "result.json").read_text())
    ran = records(out)
    assert len(ran) == 6  # each of the three stages in two new workers
    assert result["pid"] not in {r["pid"] for r in ran}
    want = json.loads((jobs["spawn"][1] / "result.json").read_text())
    assert result["validate"] == want["validate"]


def test_a_killed_rank_zero_ends_the_ranks_it_started(jobs):
    proc, out = jobs["killed"]
    assert proc.returncode == -9, detail(proc)
    pid = int((out / "rank1.pid").read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, 9)
        pytest.fail(f"rank 1 (pid {pid}) was still running 30 s after rank 0 was killed")


def test_ranks_failing_together_are_reported_with_an_error_not_as_silent(jobs):
    """Every rank raises at the same step. Rank 0 reports its own error or a started rank's;
    before, a rank that wrote its record and exited while rank 0 waited for dead ranks was
    reported as one that died "without reporting an error", and no error was shown at all."""
    proc, _ = jobs["every-rank-fails"]
    assert proc.returncode == 1, detail(proc)
    assert "without reporting an error" not in proc.stderr, detail(proc)
    assert "RuntimeError: every rank broke: rank " in proc.stderr, detail(proc)


def test_a_started_ranks_error_outside_a_stage_is_the_jobs_error_shown_once(jobs):
    """Rank 1 raises in the script between fit and validate: rank 0's validate breaks, and
    the job's error is rank 1's. Before, rank 0 said rank 1 "exited with code 1 without
    reporting an error (out of memory? killed from outside?)" under rank 1's own traceback."""
    proc, _ = jobs["rank-one-fails-between"]
    assert proc.returncode == 1, detail(proc)
    assert "without reporting an error" not in proc.stderr, detail(proc)
    assert "rank 1 failed" in proc.stderr, detail(proc)
    assert proc.stderr.count("RuntimeError: rank 1 broke outside a stage") == 1, detail(proc)


def test_a_started_ranks_error_after_rank_zero_finished_is_shown_at_exit(jobs):
    proc, out = jobs["rank-one-fails-after"]
    assert proc.returncode == 0, detail(proc)  # rank 0, the command the user ran, finished
    assert (out / "result.json").exists()
    assert "ptrain: rank 1 (pid " in proc.stderr, detail(proc)
    assert "exited with code 1 after rank 0 finished; its error:" in proc.stderr, detail(proc)
    assert proc.stderr.count("RuntimeError: rank 1 broke outside a stage") == 1, detail(proc)


def test_ranks_stopped_by_rank_zero_after_its_failure_say_nothing_of_their_own(jobs):
    """Rank 0 fails while rank 1 waits in a collective; rank 0 stops it with two SIGTERMs.
    Rank 1's main thread is blocked, so its stop-signals thread ends it: without a word, since
    the job's error is rank 0's (it said "a second SIGTERM while the main thread was
    blocked", as if a user had sent them)."""
    proc, _ = jobs["rank-zero-fails-alone"]
    assert proc.returncode == 1, detail(proc)
    assert proc.stderr.count("RuntimeError: rank 0 broke alone") == 1, detail(proc)
    assert "a second SIGTERM" not in proc.stderr, detail(proc)


def test_relaunch_command_of_a_script_and_of_a_module(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import json, sys\nfrom ptrain.script_launch import relaunch_command\n"
                     "print(json.dumps(relaunch_command()))\n")
    as_script = run([sys.executable, "-X", "utf8", str(probe), "--flag", "x"])
    assert json.loads(as_script.stdout) == [sys.executable, "-X", "utf8", str(probe), "--flag",
                                            "x"], detail(as_script)
    package = tmp_path / "probepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(probe.read_text())
    env = {**launcher_free_env(), "PYTHONPATH": str(tmp_path)}
    as_module = subprocess.run([sys.executable, "-m", "probepkg", "a"], cwd=tmp_path, env=env,
                               capture_output=True, text=True)
    assert json.loads(as_module.stdout) == [sys.executable, "-m", "probepkg", "a"], \
        detail(as_module)
    as_code = run([sys.executable, "-c", probe.read_text().replace("\n", ";")])
    assert json.loads(as_code.stdout) is None, detail(as_code)
    # the stage called from a helper module of the program (through a decorator of its own):
    # still the program's own code, so it can be run again
    (tmp_path / "helper.py").write_text(
        "import functools, json\nfrom ptrain.script_launch import relaunch_command\n"
        "def logged(f):\n    @functools.wraps(f)\n    def inner(*a):\n        return f(*a)\n"
        "    return inner\n@logged\ndef train():\n    print(json.dumps(relaunch_command()))\n")
    main = tmp_path / "main.py"
    main.write_text("import helper\nhelper.train()\n")
    through_helper = run([sys.executable, str(main)])
    assert json.loads(through_helper.stdout) == [sys.executable, str(main)], \
        detail(through_helper)


def test_relaunch_command_is_none_under_a_test_runner():
    assert relaunch_command() is None  # called from this test module, not from __main__


def test_launcher_script_without_a_program_is_a_usage_error(make_trainer):
    from tests.conftest import TinyRegressor

    trainer = make_trainer(strategy="ddp", devices=2, max_epochs=1,
                           plugin_options={"ddp": {"launcher": "script"}})
    with pytest.raises(ConfigError, match="no program to run again") as info:
        trainer.fit(TinyRegressor())
    assert "launcher 'spawn'" in str(info.value)
