"""Lightning's own tests against ``ptrain.lightning`` (``benchmarks/lightning_peer_tests.py``,
issue 33): the share of the public-API tests (those that pass under Lightning and touch none of
its internals) that pass under ptrain must not fall below a floor per group. The floors are the
rates measured when they were set, rounded down: raise them as fixes land.

The full runs, one per group, run only with ``PTRAIN_LIGHTNING_PEER_TESTS=1`` (each takes about
half an hour on two cores, too long for the suite); the suite runs a seeded draw of 30 tests
(three minutes). Both need a checkout of Lightning's GitHub repository
(``PTRAIN_LIGHTNING_REPO``, or the mirror at ``/work/.mirror``): Lightning's tests are never
committed here. They take the
Lightning run's outcomes from the committed ``results.json`` and run only the ptrain side. The
fast tests check the harness itself: the rewrite, the tolerant imports, the classification and
the grouping of failures.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._campaigns import WHOLE_TOOL_RUNS

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import lightning_peer_plugin as plugin  # noqa: E402
import lightning_peer_tests as peer  # noqa: E402

CHECKOUT = Path(os.environ.get("PTRAIN_LIGHTNING_REPO", str(peer.MIRROR)))
RESULTS = REPO / "benchmarks" / "results" / "lightning-peer-tests" / "results.json"
#: per group: (public-API tests passing under ptrain at least this %, at least this many
#: public-API tests: a classification that shrank the denominator would hide failures)
FLOOR = {"issue": (89.0, 240), "central": (69.0, 400)}  # measured 89.4% of 245, 69.9% of 409


#: the suite's quick check: this many public-API tests that pass under Lightning, drawn with
#: this seed from results.json, must pass under ptrain at least this often (measured 23 of 28,
#: 82.1%, at da80f78: a draw from a new results.json needs the floor measured again)
DRAW, DRAW_SEED, DRAW_FLOOR = 30, 0, 75.0


def _full_run_not_asked() -> str | None:
    if os.environ.get("PTRAIN_LIGHTNING_PEER_TESTS") != "1":
        return ("Lightning's own tests take about half an hour a group: run them with "
                "PTRAIN_LIGHTNING_PEER_TESTS=1 (the suite runs a sample)")
    return _checkout_missing()


def _checkout_missing() -> str | None:
    if not (CHECKOUT / "HEAD").exists() and not (CHECKOUT / ".git").exists():
        return (f"no checkout of Lightning's repository at {CHECKOUT} (set "
                "PTRAIN_LIGHTNING_REPO); its tests can't be committed here")
    done = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--verify", "--quiet",
                           f"{peer.DEFAULT_REF}^{{commit}}"], capture_output=True)
    if done.returncode != 0:
        return f"{CHECKOUT} has no {peer.DEFAULT_REF}"
    if importlib.util.find_spec("lightning") is None:
        return "the Lightning oracle is not installed"
    if not RESULTS.exists():
        return f"no Lightning outcomes to compare with ({RESULTS})"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(FLOOR))
def test_the_public_api_pass_rate_does_not_fall(group, tmp_path):
    reason = _full_run_not_asked()
    if reason:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lightning_peer_tests.py"),
         "--lightning-repo", str(CHECKOUT), "--group", group, "--baseline-json", str(RESULTS),
         "--out", str(tmp_path), "--jobs", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=3 * 3600)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    files = json.loads((tmp_path / "results.json").read_text())["files"]
    public = sum(f["public"] for f in files.values())
    passed = sum(f["ptrain_passed_public"] for f in files.values())
    rate, at_least = FLOOR[group]
    assert public >= at_least, f"only {public} public-API tests (was {at_least})\n{done.stdout}"
    assert 100.0 * passed / max(public, 1) >= rate, \
        f"{passed} of {public} public-API tests pass (floor {rate}%)\n{done.stdout}"


@pytest.mark.slow
@WHOLE_TOOL_RUNS
def test_a_seeded_sample_of_lightnings_tests_passes(tmp_path):
    reason = _checkout_missing()
    if reason:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lightning_peer_tests.py"),
         "--lightning-repo", str(CHECKOUT), "--group", "all", "--baseline-json", str(RESULTS),
         "--out", str(tmp_path), "--jobs", "2", "--sample", str(DRAW),
         "--seed", str(DRAW_SEED)],
        cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["tests"]) == DRAW  # the draw ran whole
    public = sum(f["public"] for f in results["files"].values())
    passed = sum(f["ptrain_passed_public"] for f in results["files"].values())
    assert public >= DRAW - 5, f"only {public} of the {DRAW} drawn are public-API tests"
    assert 100.0 * passed / public >= DRAW_FLOOR, \
        f"{passed} of {public} public-API tests pass (floor {DRAW_FLOOR}%)\n" + \
        (tmp_path / "summary.txt").read_text()


def test_the_sample_is_drawn_alike_from_the_same_outcomes():
    baseline = {"tests": [
        {"nodeid": f"tests_pytorch/a/test_{i % 3}.py::test_{i}", "file": f"a/test_{i % 3}.py",
         "api": "internal" if i % 5 == 0 else "public",
         "lightning": {"outcome": "skipped" if i % 7 == 0 else "passed"}} for i in range(40)]}
    files = {"a/test_0.py", "a/test_1.py"}
    first = peer.draw_sample(baseline, files, 10, seed=3)
    assert first == peer.draw_sample(baseline, files, 10, seed=3)
    assert first != peer.draw_sample(baseline, files, 10, seed=4)
    drawn = [n for ids in first.values() for n in ids]
    assert len(drawn) == len(set(drawn)) == 10
    eligible = {t["nodeid"] for t in baseline["tests"] if t["file"] in files
                and t["api"] == "public" and t["lightning"]["outcome"] == "passed"}
    assert set(drawn) <= eligible
    assert all(n.split("::")[0] == f"tests_pytorch/{f}" for f, ids in first.items() for n in ids)
    # more than there are: every eligible test, once
    assert sorted(n for ids in peer.draw_sample(baseline, files, 99, 0).values()
                  for n in ids) == sorted(eligible)


# --- the harness ---------------------------------------------------------------------------------

def test_the_rewrite_changes_the_trainer_and_leaves_the_utilities():
    source = textwrap.dedent("""\
        import lightning.pytorch as pl
        from pytorch_lightning.callbacks import EarlyStopping
        from lightning.pytorch.utilities.imports import _OMEGACONF_AVAILABLE
        from lightning.fabric.utilities.cloud_io import _load
        from lightning_utilities.core.imports import compare_version
        target = "lightning.pytorch.loops.fit_loop.log"
        other = "mylightning.pytorch"
        """)
    out = peer.rewrite_text(source)
    assert "import ptrain.lightning as pl" in out
    assert "from ptrain.lightning.callbacks import EarlyStopping" in out
    assert "from lightning.pytorch.utilities.imports import _OMEGACONF_AVAILABLE" in out
    assert "from lightning.fabric.utilities.cloud_io import _load" in out
    assert "from lightning_utilities.core.imports" in out
    assert '"ptrain.lightning.loops.fit_loop.log"' in out
    assert '"mylightning.pytorch"' in out


def test_module_level_imports_become_tolerant_and_keep_the_line_numbers():
    source = textwrap.dedent("""\
        import torch
        from ptrain.lightning.demos import (
            BoringModel,
            RandomDataset as RD,
        )
        import ptrain.lightning.loops.fit_loop as loops

        def test_x():
            from ptrain.lightning.callbacks import Timer
        """)
    out = peer.tolerant_imports(source, conftest=False)
    assert len(out.split("\n")) == len(source.split("\n"))
    tree = ast.parse(out)
    assert "peer_from('ptrain.lightning.demos', (('BoringModel', 'BoringModel'), " \
           "('RandomDataset', 'RD'))" in out
    assert "loops = __import__('lightning_peer_plugin').peer_module(" in out
    assert isinstance(tree.body[-1].body[0], ast.ImportFrom)  # inside a test: left as it is
    conftest = peer.tolerant_imports("from ptrain.lightning.accelerators import XLAAccelerator\n",
                                     conftest=True)
    assert conftest == "from lightning.pytorch.accelerators import XLAAccelerator\n"


def test_a_missing_name_is_a_stand_in_that_refuses_once_collection_is_over(monkeypatch):
    monkeypatch.setattr(plugin, "ABSENT", {})
    monkeypatch.setattr(plugin, "_STRICT", False)
    present, missing = plugin.peer_from("ptrain.lightning", (("Trainer", "Trainer"),
                                                            ("NoSuchName", "Alias")), "m")
    import ptrain.lightning
    assert present is ptrain.lightning.Trainer
    assert plugin.ABSENT == {("m", "Alias"): "cannot import name 'NoSuchName' from "
                                             "'ptrain.lightning'"}

    class Sub(missing):  # lenient while modules are collected
        pass
    assert missing.anything(1) is not None and not missing
    with pytest.raises(ImportError, match="NoSuchName"):
        Sub()
    monkeypatch.setattr(plugin, "_STRICT", True)
    with pytest.raises(ImportError, match="NoSuchName"):
        missing()
    with pytest.raises(ImportError, match="NoSuchName"):
        missing.attribute
    gone = plugin.peer_module("ptrain.lightning.no_such_module", "m", "nsm")
    assert isinstance(gone, plugin.Absent) and ("m", "nsm") in plugin.ABSENT


def _classify(source: str, qualname: str) -> list[str]:
    pytest.importorskip("lightning")
    rel = "tests_pytorch/test_sample.py"
    mod = peer.index_module(rel, textwrap.dedent(source))
    conftest = peer.index_module("tests_pytorch/conftest.py", textwrap.dedent("""\
        import pytest
        import lightning.pytorch
        def mock_cuda_count(monkeypatch, n):
            monkeypatch.setattr(lightning.pytorch.accelerators.cuda, "num_cuda_devices", lambda: n)
        @pytest.fixture
        def cuda_count_2(monkeypatch):
            mock_cuda_count(monkeypatch, 2)
        """))
    classifier = peer.Classifier({mod.name: mod, conftest.name: conftest})
    reasons, _ = classifier.classify(mod, qualname)
    return reasons


SAMPLE = """\
import os
from unittest import mock
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.trainer import Trainer as T2
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loops import _EvaluationLoop
from lightning.pytorch.trainer.states import TrainerFn

class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self._seen = 0
    def training_step(self, batch, batch_idx):
        self._seen += 1
        return super().training_step(batch, batch_idx)

class Peeking(BoringModel):
    def on_train_epoch_end(self):
        assert self.trainer._results is not None

class Saver(ModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath):
        pass

def test_public(tmp_path):
    model = Model()
    trainer = Trainer(default_root_dir=tmp_path)
    with mock.patch.dict(os.environ, {"X": "1"}), mock.patch.object(model, "training_step"):
        trainer.fit(model)
    assert trainer.state.fn == TrainerFn.FITTING and torch._C is not None and T2 is Trainer

def test_private_attribute(tmp_path):
    Trainer().fit(Peeking())

def test_loops():
    assert Trainer().fit_loop.max_epochs

def test_patches():
    with mock.patch("lightning.pytorch.trainer.trainer.Trainer.fit"):
        pass

def test_patches_the_trainer(tmp_path):
    trainer = Trainer()
    with mock.patch.object(trainer.strategy, "save_checkpoint"):
        pass

def test_fakes_gpus(cuda_count_2):
    Trainer(accelerator="gpu")

def test_internal_import():
    _EvaluationLoop

def test_overrides_a_private_method():
    Saver()
"""


@pytest.mark.parametrize("test, expected", [
    ("test_public", []),
    ("test_private_attribute", ["private attribute ._results"]),
    ("test_loops", ["reaches .fit_loop"]),
    ("test_patches", ["patches lightning.pytorch.trainer.trainer.Trainer.fit"]),
    ("test_patches_the_trainer", ["patches trainer.strategy.save_checkpoint"]),
    ("test_fakes_gpus", ["patches lightning.pytorch.accelerators.cuda.num_cuda_devices"]),
    ("test_internal_import", ["imports lightning.pytorch.loops._EvaluationLoop"]),
    ("test_overrides_a_private_method", ["overrides Lightning's _save_checkpoint"]),
])
def test_a_test_is_public_unless_it_reaches_lightnings_internals(test, expected):
    assert _classify(SAMPLE, test) == expected


def test_failures_group_by_a_normalised_cause():
    refused = {"exc_type": "ConfigError", "phase": "call", "message":
               "ModelCheckpoint(dirpath='/tmp/x/y') is not supported by ptrain, and ignoring it "
               "would silently change the run: leave it out."}
    assert peer.cause(refused) == "ConfigError: ModelCheckpoint(dirpath=...) refused"
    missing = {"exc_type": "ImportError", "phase": "setup", "message":
               f"ModuleNotFoundError: No module named 'ptrain.lightning.cli' "
               f"{plugin.NEEDED_FOR} 'LightningCLI'"}
    assert peer.cause(missing) == "ImportError: ModuleNotFoundError: No module named " \
                                  "'ptrain.lightning.cli'"
    a = {"exc_type": "KeyError", "phase": "teardown", "message": "'epoch_3' at /tmp/a/b.ckpt"}
    b = {"exc_type": "KeyError", "phase": "teardown", "message": "'epoch_7' at /tmp/c.ckpt"}
    assert peer.cause(a) == peer.cause(b) == "[teardown] KeyError: 'epoch_N' at <path>"
    wording = {"outcome": "failed", "exc_type": "Failed",
               "message": "Regex pattern did not match.\n Regex: 'x'\n Input: 'y'"}
    assert peer.is_wording(wording)
    assert not peer.is_wording({**wording, "message": "DID NOT RAISE <class 'ValueError'>"})
