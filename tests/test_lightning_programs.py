"""Public Lightning programs nobody wrote for ptrain, through ``benchmarks/lightning_programs.py``.

The programs are read from repository snapshots (``/work/.mirror`` or ``LP_MIRRORS``) and never
kept here, so the tests that run them are skipped, with the reason, where the snapshots are
missing. One cheap program runs in the suite; the whole catalogue (about an hour on two cores)
runs with ``PTRAIN_LIGHTNING_PROGRAMS=1`` and checks issue 33's target: at least 9 in 10
programs run under ptrain and reach Lightning's metrics in every setting.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the oracle: pip install lightning==2.6.6 (dev extra)")

HARNESS = Path(__file__).resolve().parent.parent / "benchmarks" / "lightning_programs.py"
MIRRORS = Path(os.environ.get("LP_MIRRORS", "/work/.mirror"))


def _harness():
    spec = importlib.util.spec_from_file_location("lightning_programs", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lp = _harness()


def _snapshot(mirror: str) -> Path:
    path = MIRRORS / mirror / "repo"
    if not path.is_dir():
        pytest.skip(f"no snapshot of {mirror} under {MIRRORS} (the programs are read from "
                    "public repositories' snapshots, never kept in this repository)")
    return path


def test_the_rewrite_changes_import_lines_and_hydra_targets_only():
    source = ("import lightning as L\nimport lightning.pytorch as pl\n"
              "from pytorch_lightning.callbacks import X\nfrom lightning import Trainer\n"
              "    import pytorch_lightning as pl\nfrom lightning.fabric import Fabric\n"
              "x = 'lightning.pytorch'\nimport lightning_utilities\n")
    assert lp.port(source) == (
        "import ptrain.lightning as L\nimport ptrain.lightning as pl\n"
        "from ptrain.lightning.callbacks import X\nfrom ptrain.lightning import Trainer\n"
        "    import ptrain.lightning as pl\nfrom lightning.fabric import Fabric\n"
        "x = 'lightning.pytorch'\nimport lightning_utilities\n")
    assert lp.port_yaml("_target_: lightning.pytorch.trainer.Trainer\nname: lightning.pytorch\n"
                        "  _target_: \"lightning.pytorch.callbacks.ModelCheckpoint\"\n") == \
        ("_target_: ptrain.lightning.trainer.Trainer\nname: lightning.pytorch\n"
         "  _target_: \"ptrain.lightning.callbacks.ModelCheckpoint\"\n")


def test_a_notebook_becomes_its_code_cells_without_ipython_lines():
    book = json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["# title"]},
        {"cell_type": "code", "source": ["!pip install x\n", "a = 1\n"]},
        {"cell_type": "code", "source": ["try:\n", "    import y\n", "except ImportError:\n",
                                         "    !pip install y\n"]}]})
    script = lp.notebook_script(book, "ipynb", None)
    namespace: dict = {}
    compile(script, "nb", "exec")
    assert "pip" not in script.replace("pass  # IPython line left out", "").split("install")[0]
    exec(compile(script.replace("import y", "import json as y"), "nb", "exec"), namespace)
    assert namespace["a"] == 1
    jupytext = "# %%\nb = 2\n# %% [markdown]\n# text\n# %%\nc = b + 1\n"
    assert [c.strip().splitlines()[-1] for c in lp.notebook_cells(jupytext, "jupytext")] == \
        ["b = 2", "c = b + 1"]


def test_metrics_compare_within_the_dropin_tolerance():
    same = lp.compare({"a": 1.0, "b": 2.0}, {"a": 1.0 + 1e-9, "b": 2.0}, 1e-6)
    assert same["within"] and same["compared"] == 2
    off = lp.compare({"a": 1.0}, {"a": 1.01}, 1e-6)
    assert not off["within"] and off["max_rel"] == pytest.approx(0.01)
    missing = lp.compare({"a": 1.0, "b": 1.0}, {"a": 1.0}, 1e-6)
    assert not missing["within"] and missing["only_lightning"] == ["b"]


def test_the_metrics_are_those_of_the_runs_last_command(tmp_path):
    # a resume's two processes each leave a record; the second half's is the run's result
    for pid, half, acc in ((11, "resume1", 0.2), (12, "resume2", 0.4)):
        (tmp_path / f"probe-{pid}.json").write_text(json.dumps(
            {"pid": pid, "argv": ["drive.py", "ptrain", half, "mid.ckpt"], "rank": None,
             "records": [{"stage": "fit", "callback_metrics": {"acc": acc}}]}))
    for half, acc in (("resume2", 0.4), ("resume1", 0.2)):
        metrics, errors = lp._metrics_from_probes(
            tmp_path, ["/usr/bin/python", "drive.py", "ptrain", half, "mid.ckpt"])
        assert metrics == {"fit0/acc": acc} and errors == []


def test_a_ddp_runs_metrics_are_the_mean_over_its_ranks(tmp_path):
    argv = ["drive.py", "lightning.pytorch", "ddp"]
    for pid, rank, acc in ((21, "0", 0.25), (22, "1", 0.75)):
        (tmp_path / f"probe-{pid}.json").write_text(json.dumps(
            {"pid": pid, "argv": argv, "rank": rank,
             "records": [{"stage": "fit", "callback_metrics": {"acc": acc, "rank0_only": 1.0}
                          if rank == "0" else {"acc": acc}}]}))
    mean, _ = lp._metrics_from_probes(tmp_path, ["python", *argv], mean_over_ranks=True)
    assert mean == {"fit0/acc": 0.5}  # a name only one rank logged is left out
    rank0, _ = lp._metrics_from_probes(tmp_path, ["python", *argv])
    assert rank0 == {"fit0/acc": 0.25, "fit0/rank0_only": 1.0}


def test_a_resume_is_judged_against_lightnings_unbroken_run():
    run = lambda **metrics: {"ran": True, "metrics": metrics}  # noqa: E731
    rows = {"unbroken": {"lightning": run(acc=0.5), "ptrain": run(acc=0.5)},
            # Lightning's own resume draws other dropout masks; ptrain's ends where unbroken does
            "resume": {"lightning": run(acc=0.4), "ptrain": run(acc=0.5)}}
    lp.set_compare(rows, "resume")
    verdict = rows["resume"]["compare"]
    assert verdict["within"] and verdict["against"] == "Lightning unbroken"
    assert verdict["vs_lightning_resume"] == pytest.approx(0.25)
    rows["resume"]["ptrain"] = run(acc=0.4)  # a resume that did not restore what it should
    lp.set_compare(rows, "resume")
    assert not rows["resume"]["compare"]["within"]
    # without an unbroken run of Lightning's, the resume is compared with Lightning's resume
    lp.set_compare({"resume": rows["resume"]}, "resume")
    assert rows["resume"]["compare"]["within"] and "against" not in rows["resume"]["compare"]


def test_a_run_keeps_the_callers_pythonpath_after_the_probe(monkeypatch):
    # without it a run from a checkout imports the installed ptrain, not the checkout's
    monkeypatch.setenv("PYTHONPATH", "/checkout/core")
    assert lp._pythonpath({}).split(os.pathsep) == [str(lp.HERE / "probe"), "/checkout/core"]
    assert lp._pythonpath({"standins": True}).split(os.pathsep) == [
        str(lp.HERE / "probe"), str(lp.HERE / "standins"), "/checkout/core"]
    monkeypatch.delenv("PYTHONPATH")
    assert lp._pythonpath({}) == str(lp.HERE / "probe")


def test_the_torchvision_standin_serves_the_programs_files_only(tmp_path):
    # torchmetrics and Lightning probe for torchvision and then import parts the stand-in
    # lacks: to them it must look absent, to the program's own files present
    pytest.importorskip("PIL")
    lp._load("data").make_mnist(tmp_path)
    (tmp_path / "program.py").write_text(
        "from lightning_utilities.core.imports import RequirementCache\n"
        "assert not RequirementCache('torchvision')  # as torchmetrics asks, on import\n"
        "from torchvision import datasets, transforms\n"
        "ds = datasets.MNIST('.', train=False, transform=transforms.Compose(\n"
        "    [transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))]))\n"
        "x, y = ds[3]\n"
        "raw = ds.data[3].float() / 255\n"
        "assert len(ds) == 10000 and x.shape == (1, 28, 28) and isinstance(y, int)\n"
        "assert (x[0] - (raw - 0.5) / 0.5).abs().max() < 1e-6\n"
        "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(lp.HERE / "standins"),
           "LP_STANDIN_ROOT": str(tmp_path)}
    out = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    env["LP_STANDIN_ROOT"] = str(tmp_path / "elsewhere")
    out = subprocess.run([sys.executable, "program.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert "the torchvision stand-in is for the program's own files only" in out.stderr


@pytest.mark.slow
def test_lightnings_bug_report_program_runs_alike(tmp_path):
    _snapshot("Lightning-AI+pytorch-lightning")
    out = tmp_path / "out"
    assert lp.main(["--only", "pl-bug-report", "--configs", "single", "--mirrors", str(MIRRORS),
                    "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    row = json.loads((out / "results.json").read_text())["results"]["pl-bug-report"]["single"]
    assert row["lightning"]["ran"], row["lightning"].get("error")
    assert row["ptrain"]["ran"], row["ptrain"].get("error")
    assert row["compare"]["compared"] >= 2  # train_loss, valid_loss, test_loss
    assert row["compare"]["within"], row["compare"]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PTRAIN_LIGHTNING_PROGRAMS") != "1",
                    reason="the whole catalogue takes about an hour on two cores: set "
                           "PTRAIN_LIGHTNING_PROGRAMS=1 (and have /work/venv-tv, see "
                           "benchmarks/lightning_programs/README.md)")
def test_nine_in_ten_public_programs_run_and_match(tmp_path):
    catalogue = lp._load("catalogue").PROGRAMS
    for mirror in sorted({p["mirror"] for p in catalogue}):
        _snapshot(mirror)
    out = tmp_path / "out"
    assert lp.main(["--mirrors", str(MIRRORS), "--work", str(tmp_path / "work"),
                    "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())["results"]
    good = [name for name, rows in results.items()
            if all(row.get("ptrain", {}).get("ran") and row.get("compare", {}).get("within")
                   for row in rows.values())]
    print(f"{len(good)} of {len(results)} programs run and match: {good}", file=sys.stderr)
    assert len(good) >= 0.9 * len(results)
