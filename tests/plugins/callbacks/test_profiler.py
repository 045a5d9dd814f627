"""The ``profiler`` callback plugin, on real ``torch.profiler`` runs (nothing of torch replaced).

``ProfiledRegressor`` trains a linear model on 64 samples in batches of 8: 8 training steps per
epoch, so the steps a schedule records follow from its numbers alone (step N is the N-th training
batch of the run, from 0). The traces are checked as TensorBoard's PyTorch Profiler plugin
(``torch-tb-profiler``) would find and read them: ``<run>/profiler/<worker>.<span>.pt.trace.json``,
Chrome-trace JSON with ``traceEvents`` and ``ProfilerStep#N`` events. That plugin is not installed
here, and TensorBoard itself has no reader for these files (its own readers take event files), so
the layout and contents are checked directly. The CLI runs start up front (``cli_runs``) so that
they overlap with the in-process tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from ptrain import ConfigError
from ptrain.errors import WorkerError
from ptrain_profiler import (BACKWARD, DATA_LOADING, FORWARD, OPTIMIZER_STEP, TRANSFER_BATCH,
                             Profiler)
from tests._cli_util import CLIRuns, assert_ok, assert_usage_error
from tests._profiler_models import USER_REGION, ProfiledRegressor
from conftest import DIGITS_CONFIG

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]
#: The loop's regions in the order they run within one step.
STEP_REGIONS = [DATA_LOADING, TRANSFER_BATCH, FORWARD, BACKWARD, OPTIMIZER_STEP]
#: How the PyTorch Profiler plugin of TensorBoard recognises a trace file of a run's worker.
TB_TRACE_NAME = re.compile(r"^(?P<worker>rank\d+)\.(?P<span>\d+)\.pt\.trace\.json$")


def fit(make_trainer, profiler: Profiler, module=None, max_epochs: int = 2, **options):
    trainer = make_trainer(max_epochs=max_epochs, callbacks=[profiler, *QUIET], **options)
    trainer.fit(module if module is not None else ProfiledRegressor())
    return trainer


def read_trace(path: Path) -> list[dict]:
    """The trace's complete events (``ph == "X"``), after checking it is Chrome-trace JSON."""
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list), path
    return [e for e in data["traceEvents"] if e.get("ph") == "X"]


def profiler_steps(events: list[dict]) -> list[int]:
    return sorted(int(e["name"].split("#")[1]) for e in events
                  if e["name"].startswith("ProfilerStep#"))


def named(events: list[dict], name: str) -> list[dict]:
    return sorted((e for e in events if e["name"] == name), key=lambda e: e["ts"])


def within(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def trace_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.pt.trace.json*"), key=lambda p: int(p.name.split(".")[1]))


@pytest.fixture(scope="module")
def cli_runs(request, tmp_path_factory):
    """The module's CLI runs, started before its first test; ``cli_runs.dirs[key]`` is a run's
    scratch folder."""
    pool = CLIRuns(request)
    table = pool.dirs["table"] = tmp_path_factory.mktemp("table")
    pool.start("table", "fit", "--config", DIGITS_CONFIG, "--max-epochs", "1",
               "--limit-train-batches", "8", "--limit-val-batches", "2", "-p", "profiler",
               "--profiler-skip-first", "2", "--profiler-row-limit", "4",
               "--profiler-sort-by", "cpu_time_total", "--no-progress-bar",
               "-p", "no:tensorboard", "--default-root-dir", str(table / "runs"),
               used_by=("test_cli_prints_the_operator_table_with_the_chosen_rows_and_sort_key",))
    tiny = ["fit", "--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu",
            "--max-epochs", "1", "--no-progress-bar", "-p", "profiler"]
    for key, extra in BAD_OPTIONS.items():
        folder = pool.dirs[key] = tmp_path_factory.mktemp(key)
        pool.start(key, *tiny, *extra[0], "--default-root-dir", str(folder / "runs"),
                   used_by=("test_cli_refuses_a_bad_option_with_a_usage_error",))
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def _start_cli_runs(cli_runs):
    """Every test of the module asks for the CLI runs, so that they start with the first."""


# -- traces and schedule ------------------------------------------------------------------------


def test_each_cycle_writes_a_tensorboard_chrome_trace_of_exactly_the_scheduled_steps(
        make_trainer, capsys):
    # 16 steps; cycles of wait 1 + warmup 1 + active 3 after 2 skipped: steps 2-6 and 7-11,
    # recording 4-6 and 9-11 (repeat=2: nothing after 11)
    profiler = Profiler(skip_first=2, wait=1, warmup=1, active=3, repeat=2)
    trainer = fit(make_trainer, profiler)
    folder = trainer.log_dir / "profiler"
    files = trace_files(folder)
    assert [p.name for p in files] == [p.name for p, _ in profiler.traces]
    assert [steps for _, steps in profiler.traces] == [[4, 5, 6], [9, 10, 11]]
    for path, expected in zip(files, ([4, 5, 6], [9, 10, 11])):
        assert TB_TRACE_NAME.match(path.name), path.name
        assert TB_TRACE_NAME.match(path.name)["worker"] == "rank0"
        events = read_trace(path)
        assert profiler_steps(events) == expected
        steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")),
                       key=lambda e: e["ts"])
        for name in [*STEP_REGIONS, USER_REGION]:
            assert len(named(events, name)) == 3, (name, path.name)
        for i, step in enumerate(steps):
            regions = [named(events, name)[i] for name in STEP_REGIONS]
            assert all(within(region, step) for region in regions), step["name"]
            starts = [region["ts"] for region in regions]
            assert starts == sorted(starts), step["name"]  # data, transfer, fwd, bwd, optimizer
            assert within(named(events, USER_REGION)[i], named(events, FORWARD)[i])
        # the data-loading region holds the dataloader's fetch of the step's batch
        fetches = [e for e in events if e["name"].startswith("enumerate(DataLoader)")]
        assert len(fetches) == 3
        assert all(within(f, d) for f, d in zip(sorted(fetches, key=lambda e: e["ts"]),
                                                named(events, DATA_LOADING)))
    out = capsys.readouterr().out
    assert "Profiler: recorded training steps 4-6, 9-11 (2 cycles)" in out
    assert "Most expensive operators of the last recorded cycle (steps 9-11), by " \
           "self_cpu_time_total:" in out
    assert "Self CPU" in out and "aten::" in out


def test_the_profiler_collects_only_during_the_scheduled_steps_and_stops_after_them(
        make_trainer):
    module = ProfiledRegressor()
    profiler = Profiler(skip_first=0, wait=3, warmup=1, active=2, repeat=1)
    fit(make_trainer, profiler, module)
    assert len(module.enabled) == 16
    assert [i for i, on in enumerate(module.enabled) if on] == [4, 5]  # the active steps only
    assert [steps for _, steps in profiler.traces] == [[4, 5]]
    assert not torch.autograd._profiler_enabled()


def test_a_run_shorter_than_the_schedule_says_which_options_to_lower(make_trainer, capsys):
    profiler = Profiler(skip_first=20)
    trainer = fit(make_trainer, profiler, max_epochs=1)
    assert not (trainer.log_dir / "profiler").exists()
    out = capsys.readouterr().out
    assert "no training step was recorded: the run had 8 steps and the schedule records from " \
           "step 22. Lower --profiler-skip-first" in out


def test_a_run_ending_inside_a_cycle_writes_the_steps_recorded_so_far(make_trainer):
    profiler = Profiler(skip_first=0, wait=5, warmup=1, active=10, repeat=1)
    trainer = fit(make_trainer, profiler, max_epochs=1)  # steps 0-7: records 6, 7
    (path,) = trace_files(trainer.log_dir / "profiler")
    assert profiler_steps(read_trace(path)) == [6, 7]


def test_shapes_memory_and_stacks_are_recorded_when_asked_and_dir_is_honoured(
        make_trainer, tmp_path, capsys):
    folder = tmp_path / "traces"
    profiler = Profiler(skip_first=0, wait=0, warmup=1, active=1, record_shapes=True,
                        profile_memory=True, with_stack=True, dir=str(folder),
                        sort_by="self_cpu_memory_usage", row_limit=3)
    fit(make_trainer, profiler, max_epochs=1)
    (path,) = trace_files(folder)
    data = json.loads(path.read_text())
    ops = [e for e in data["traceEvents"] if e.get("name") == "aten::addmm"]
    assert ops and all("Input Dims" in e["args"] for e in ops)
    assert any(e.get("name") == "[memory]" for e in data["traceEvents"])
    assert any(e.get("cat") == "python_function" for e in data["traceEvents"])
    assert "by self_cpu_memory_usage:" in capsys.readouterr().out


def test_without_the_options_no_shapes_memory_or_stacks_are_recorded(make_trainer):
    profiler = Profiler(skip_first=0, wait=0, warmup=1, active=1)
    trainer = fit(make_trainer, profiler, max_epochs=1)
    (path,) = trace_files(trainer.log_dir / "profiler")
    events = json.loads(path.read_text())["traceEvents"]
    assert not any("Input Dims" in e.get("args", {}) for e in events)
    assert not any(e.get("name") == "[memory]" for e in events)
    assert not any(e.get("cat") == "python_function" for e in events)


def test_module_names_label_each_submodules_forward_within_the_step_and_cost_nothing_after(
        make_trainer):
    profiler = Profiler(skip_first=0, wait=0, warmup=1, active=1, record_module_names=True)
    module = ProfiledRegressor()
    trainer = fit(make_trainer, profiler, module=module, max_epochs=1)
    (path,) = trace_files(trainer.log_dir / "profiler")
    events = read_trace(path)
    linear = named(events, "[module] Linear: net.1")
    assert linear and named(events, "[module] Dropout: net.0")
    assert all(any(within(e, f) for f in named(events, FORWARD)) for e in linear)
    # recorded steps only (the warm-up step is discarded), and no hook left once the schedule
    # has ended
    assert len(linear) == 1
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


# -- errors -------------------------------------------------------------------------------------


def test_teardown_after_an_error_leaves_no_profiler_running_and_a_second_run_works(
        make_trainer, capsys):
    failing = ProfiledRegressor(fail_at=5)  # inside the recorded steps 4-6
    with pytest.raises(RuntimeError, match="failing on purpose"):
        fit(make_trainer, Profiler(skip_first=2, wait=1, warmup=1, active=3), failing)
    assert failing.enabled[4:6] == [True, True]
    assert not torch.autograd._profiler_enabled()
    assert "Profiler:" not in capsys.readouterr().out  # no report for a failed run

    with torch.profiler.profile() as prof:  # a profiler of the user's own starts
        torch.ones(2).add(1)
    assert any(e.key == "aten::add" for e in prof.key_averages())

    profiler = Profiler(skip_first=2, wait=1, warmup=1, active=3)
    fit(make_trainer, profiler)
    assert [steps for _, steps in profiler.traces] == [[4, 5, 6]]
    assert not torch.autograd._profiler_enabled()


@pytest.mark.parametrize("kwargs, needles", [
    ({"active": 0}, ["active must be an integer >= 1", "--profiler-active"]),
    ({"wait": -1}, ["wait must be an integer >= 0", "--profiler-wait"]),
    ({"repeat": 1.5}, ["repeat must be an integer", "1.5"]),
    ({"activities": "cpu,tpu"}, ["valid choices", "cpu,cuda", "--profiler-activities"]),
    ({"sort_by": "fastest"}, ["valid choices", "self_cpu_time_total", "--profiler-sort-by"]),
    ({"sort_by": "cpu_memory_usage"}, ["--profiler-profile-memory"]),
])
def test_bad_arguments_are_config_errors_naming_the_fix(kwargs, needles):
    with pytest.raises(ConfigError) as info:
        Profiler(**kwargs)
    for needle in needles:
        assert needle in str(info.value)


def test_cuda_activity_on_a_cpu_run_is_refused_before_training(make_trainer):
    # the CLI turns this ConfigError, raised in setup, into a usage error like the ones below
    module = ProfiledRegressor()
    with pytest.raises(ConfigError, match="records CUDA, but this run trains on cpu; use "
                                          "--profiler-activities cpu"):
        fit(make_trainer, Profiler(activities="cuda"), module)
    assert module.enabled == []
    assert not torch.autograd._profiler_enabled()


# -- the CLI ------------------------------------------------------------------------------------

BAD_OPTIONS = {  # key: (flags, what the message must name)
    "active": (["--profiler-active", "0"], ["active", ">= 1", "--profiler-active"]),
    "activity": (["--profiler-activities", "tpu"],
                 ["--profiler-activities", "valid choices", "cpu", "cuda"]),
}


@pytest.mark.parametrize("key", sorted(BAD_OPTIONS))
def test_cli_refuses_a_bad_option_with_a_usage_error(cli_runs, key):
    assert_usage_error(cli_runs[key], *BAD_OPTIONS[key][1])
    assert not list(cli_runs.dirs[key].rglob("*.pt.trace.json"))


def test_cli_prints_the_operator_table_with_the_chosen_rows_and_sort_key(cli_runs):
    result = cli_runs["table"]
    assert_ok(result)
    out = result.stdout
    assert "Profiler: recorded training steps 4-6 (1 cycle)" in out
    assert "Most expensive operators of the last recorded cycle (steps 4-6), by cpu_time_total:" \
        in out
    table = out.split("by cpu_time_total:\n")[1]
    lines = table.splitlines()
    separators = [i for i, line in enumerate(lines) if line.strip().startswith("---")]
    header, rows = lines[separators[0] + 1], lines[separators[1] + 1:separators[2]]
    assert "CPU total" in header and len(rows) == 4
    column = header.index("CPU total %")  # the percentages of the sort key, right-aligned
    shares = [float(row[column:column + 12].strip().rstrip("%")) for row in rows]
    assert shares == sorted(shares, reverse=True)
    (run,) = (cli_runs.dirs["table"] / "runs").iterdir()
    (path,) = trace_files(run / "profiler")
    assert profiler_steps(read_trace(path)) == [4, 5, 6]


# -- two ddp ranks ------------------------------------------------------------------------------


#: glibc's report of a corrupted heap found as a thread ends. torch 2.13's CPU profiler beside
#: gloo's threads sometimes leaves one (about 1 run in 10 here, always after the worker's
#: function has returned, as a rank's process exits); PyTorch's own DDP-with-profiler test was
#: disabled for the same kind of abort (pytorch/pytorch#68222). Not ptrain's code: see the card.
TORCH_EXIT_ABORT = "unaligned tcache chunk detected"


def test_under_ddp_each_rank_writes_its_own_trace_and_rank_0_reports(make_trainer, capfd):
    trainer = make_trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=1,
                           callbacks=[Profiler(skip_first=0, wait=1, warmup=1, active=1), *QUIET],
                           plugin_options={"ddp": {"timeout": 120.0}})
    try:
        trainer.fit(ProfiledRegressor())
        aborted_at_exit = None
    except WorkerError as exc:
        aborted_at_exit = exc
    out, err = capfd.readouterr()
    files = trace_files(trainer.log_dir / "profiler")
    assert sorted(TB_TRACE_NAME.match(p.name)["worker"] for p in files) == ["rank0", "rank1"]
    for path in files:
        assert profiler_steps(read_trace(path)) == [2]
    assert out.count("Profiler: recorded training steps 2 (1 cycle)") == 1
    assert "each of the 2 ranks writes rank<N>.*.pt.trace.json" in out
    if aborted_at_exit is not None:
        # everything above held: the run was done when torch's heap corruption ended a process
        assert "SIGABRT" in str(aborted_at_exit) and TORCH_EXIT_ABORT in err, aborted_at_exit
        pytest.xfail(f"torch's profiler corrupted the heap of a ddp rank, found at its exit: "
                     f"{aborted_at_exit}")
