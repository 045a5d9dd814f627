"""Checkpoints and exact resume.

The exact-resume tests run real processes: a run is SIGKILLed by a plugin in the middle of an
epoch (after a checkpoint was written), a new process resumes from ``ckpt_path="last"``, and the
final parameters must equal, bit for bit, those of an uninterrupted run in a third process.
The script is ``tests/_resume_script.py`` (shuffled data, dropout, Adam, a per-step scheduler).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ptrain
from conftest import TinyRegressor
from ptrain import checkpoint_io

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_resume_script.py"
REPO = HERE.parent
QUIET = ["no:progress-bar", "no:tensorboard"]


def start(root: Path, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), "--root", str(root), "--out", str(out),
                             *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    stdout, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stdout + stderr


class References:
    """Uninterrupted runs, one per configuration, started in the background when first asked
    for (so they overlap with the interrupted runs) and shared between tests."""

    def __init__(self, root: Path):
        self.root = root
        self.runs: dict[tuple[str, ...], tuple[subprocess.Popen, Path]] = {}
        self.outputs: dict[tuple[str, ...], tuple[int, str]] = {}

    def start(self, config: tuple[str, ...]) -> None:
        if config not in self.runs:
            folder = self.root / f"ref{len(self.runs)}"
            self.runs[config] = (start(folder, folder / "out.pt", *config), folder / "out.pt")

    def result(self, config: tuple[str, ...]) -> dict:
        self.start(config)
        proc, out = self.runs[config]
        if config not in self.outputs:
            self.outputs[config] = finish(proc)
        rc, output = self.outputs[config]
        assert rc == 0, f"the uninterrupted run failed:\n{output}"
        return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    refs = References(tmp_path_factory.mktemp("references"))
    yield refs
    for proc, _ in refs.runs.values():
        if proc.returncode is None:
            proc.kill()
            proc.communicate()


def last_loop_state(root: Path) -> dict:
    ckpt = torch.load(root / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    return ckpt["loop"]


def assert_identical(result: dict, reference: dict) -> None:
    assert result["global_step"] == reference["global_step"]
    assert result["lr"] == reference["lr"]
    assert result["scheduler"] == reference["scheduler"]
    assert result["params"].keys() == reference["params"].keys()
    for name, value in reference["params"].items():
        assert torch.equal(result["params"][name], value), (
            f"{name}: max difference {(result['params'][name] - value).abs().max().item()}")
    for key, state in reference["optimizer"]["state"].items():
        for field, value in state.items():
            got = result["optimizer"]["state"][key][field]
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(value)), (key, field)
    # epoch-level metrics: a mid-epoch checkpoint carries the running sums of the epoch
    assert result["metrics"] == reference["metrics"]
    assert {"epoch_loss", "val_loss", "train_loss"} <= set(reference["metrics"])


def interrupt_and_resume(tmp_path: Path, references: References, config: tuple[str, ...],
                         kills: list[tuple[str, ...]]) -> tuple[dict, list[dict]]:
    """Run ``config`` killed at each of ``kills`` in turn (each a resume of the one before),
    then a final resume to the end. Returns the result and the loop state each kill left."""
    references.start(config)
    root, out = tmp_path / "run", tmp_path / "out.pt"
    states = []
    for i, kill in enumerate(kills):
        rc, output = finish(start(root, out, *config, *kill, *(["--resume"] if i else [])))
        assert rc == -signal.SIGKILL, f"expected the plugin to SIGKILL the run, got {rc}:\n{output}"
        assert not out.exists()
        states.append(last_loop_state(root))
    rc, output = finish(start(root, out, *config, "--resume"))
    assert rc == 0, output
    return torch.load(out, weights_only=True), states


# -------------------------------------------------------------------------------------------
# Exact resume after SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("config,kill_step,checkpointed", [
    # a checkpoint every 3 steps; killed 2 steps after the one of step 3 (epoch 0, 3 batches)
    ((), 5, (0, 3, 3)),
    # validation in the middle of each epoch (after batch 4), between checkpoint and kill
    (("--val-check-interval", "0.5"), 14, (1, 4, 12)),
    # accumulation: 4 optimizer steps per epoch; the checkpoint of step 6 is after 4 batches
    (("--accumulate", "2"), 7, (1, 4, 6)),
    # the checkpoint written after the last batch of epoch 0, before the epoch's end
    (("--every-n-train-steps", "4", "--every-n-epochs", "0"), 10, (0, 8, 8)),
], ids=["plain", "mid-epoch-validation", "accumulate-2", "after-last-batch"])
def test_resume_after_sigkill_mid_epoch_is_exact(tmp_path, references, config, kill_step,
                                                 checkpointed):
    result, [state] = interrupt_and_resume(tmp_path, references, config,
                                           [("--kill-step", str(kill_step))])
    # killed after the checkpoint named by (epoch, batches done in it, global step)
    assert (state["epoch"], state["batch"], state["global_step"]) == checkpointed
    assert_identical(result, references.result(config))


@pytest.mark.slow
def test_resume_at_epoch_boundary_is_exact(tmp_path, references):
    # no step checkpoints: the last checkpoint is the one written at the end of epoch 0
    config = ("--every-n-train-steps", "0")
    result, [state] = interrupt_and_resume(tmp_path, references, config, [("--kill-step", "10")])
    assert (state["epoch"], state["batch"], state["global_step"]) == (1, 0, 8)
    assert_identical(result, references.result(config))


@pytest.mark.slow
def test_resume_twice_with_accumulation_is_exact(tmp_path, references):
    config = ("--accumulate", "2")
    # killed at step 7 (last checkpoint: step 6, epoch 1 after batch 3); the resumed run is
    # killed again right after batch 4 of epoch 1, the first batch of an accumulation window
    result, states = interrupt_and_resume(tmp_path, references, config,
                                          [("--kill-step", "7"), ("--kill-at", "1:4")])
    assert states[0]["global_step"] == 6
    assert_identical(result, references.result(config))


# -------------------------------------------------------------------------------------------
# Atomic writes


def test_checkpoint_folder_has_no_leftover_temp_files(make_trainer, tmp_path):
    torch.manual_seed(0)
    trainer = make_trainer(max_epochs=3, callbacks=QUIET, plugin_options={
        "checkpoint": {"every_n_train_steps": 2, "monitor": "val_loss"}})
    trainer.fit(TinyRegressor())
    folder = trainer.log_dir / "checkpoints"
    best = Path(trainer.plugins["checkpoint"].best_model_path).name  # the top-1 file
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [best, "best_k_models.json", "last.ckpt"])
    for name in (best, "last.ckpt"):
        checkpoint_io.safe_load(folder / name)


def test_atomic_save_round_trip(tmp_path):
    path = tmp_path / "deep" / "folder" / "x.ckpt"
    checkpoint = {"format": checkpoint_io.FORMAT, "format_version": checkpoint_io.FORMAT_VERSION,
                  "w": torch.arange(10.0), "nested": {"n": 3, "s": "text", "l": [1.5, None]}}
    checkpoint_io.atomic_save(checkpoint, path)
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["w"], checkpoint["w"])
    assert loaded["nested"] == checkpoint["nested"]
    assert checkpoint_io.safe_load(path)["nested"] == checkpoint["nested"]
    assert [p.name for p in path.parent.iterdir()] == ["x.ckpt"]


SAVER = """
import sys, torch
from ptrain import checkpoint_io
path, megabytes, loops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
big = torch.ones(megabytes * 2**18)  # float32: 4 bytes each
print("ready", flush=True)
for i in range(loops):
    checkpoint_io.atomic_save({"format": checkpoint_io.FORMAT, "format_version": 1, "i": i,
                               "big": big * (i + 2)}, path)
"""


def _kill_while_writing(tmp_path: Path, path: Path, megabytes: int, loops: int,
                        delay: float) -> None:
    """Start a process saving ``loops`` checkpoints to ``path``; SIGKILL it ``delay`` seconds
    after its first temporary file appeared."""
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path), str(megabytes), str(loops)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        deadline = time.monotonic() + 30
        while not any(p.name.endswith(".tmp") for p in path.parent.iterdir()):
            assert proc.poll() is None, "the saver ended before a temporary file was seen"
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def _good_checkpoint(path: Path) -> bytes:
    checkpoint_io.atomic_save({"format": checkpoint_io.FORMAT, "format_version": 1, "i": -1,
                               "big": torch.arange(1000.0)}, path)
    return path.read_bytes()


def test_a_crash_during_the_first_save_leaves_the_old_file(tmp_path):
    path = tmp_path / "ckpts" / "last.ckpt"
    before = _good_checkpoint(path)
    _kill_while_writing(tmp_path, path, megabytes=128, loops=1, delay=0.0)
    # killed while writing: the partial file is a temporary one, the checkpoint is untouched
    assert any(p.name.endswith(".tmp") for p in path.parent.iterdir())
    assert path.read_bytes() == before
    loaded = checkpoint_io.safe_load(path)
    assert loaded["i"] == -1 and torch.equal(loaded["big"], torch.arange(1000.0))


def test_a_crash_during_repeated_saves_leaves_a_whole_checkpoint(tmp_path):
    path = tmp_path / "ckpts" / "last.ckpt"
    _good_checkpoint(path)
    _kill_while_writing(tmp_path, path, megabytes=16, loops=1000, delay=0.3)
    loaded = checkpoint_io.safe_load(path)  # never a mix of two writes
    if loaded["i"] == -1:
        assert torch.equal(loaded["big"], torch.arange(1000.0))
    else:
        assert loaded["big"].numel() == 16 * 2**18
        assert torch.equal(loaded["big"], torch.full_like(loaded["big"], loaded["i"] + 2))


# -------------------------------------------------------------------------------------------
# Checkpoint contents


class CopyCheckpointAt:
    """Keeps a copy of last.ckpt as it was right after the checkpoint callback wrote it at a
    given global step (``trylast``: after the callback)."""

    def __init__(self, step: int, to: Path):
        self.step, self.to = step, to

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer):
        if trainer.global_step == self.step and not self.to.exists():
            self.to.write_bytes(trainer.last_checkpoint_path.read_bytes())


def test_checkpoint_contents(make_trainer, tmp_path):
    torch.manual_seed(0)
    module = TinyRegressor(optimizer="adam", scheduler={"gamma": 0.9, "interval": "step"})
    mid = tmp_path / "mid.ckpt"
    validations = []

    class ValLosses:
        @ptrain.hookimpl
        def on_validation_end(self, trainer):
            validations.append((float(trainer.callback_metrics["val_loss"]), trainer.global_step))

    trainer = make_trainer(max_epochs=2, callbacks=[*QUIET, CopyCheckpointAt(11, mid),
                                                    ValLosses()],
                           plugin_options={"checkpoint": {"every_n_train_steps": 11,
                                                          "monitor": "val_loss"}})
    trainer.fit(module)

    final = torch.load(trainer.last_checkpoint_path, weights_only=True)
    assert {"model", "optimizers", "lr_schedulers", "loop", "rng", "plugins",
            "config"} <= set(final)
    assert final["model"].keys() == module.state_dict().keys()
    for name, value in module.state_dict().items():
        assert torch.equal(final["model"][name], value)
    [opt_state] = final["optimizers"]
    assert opt_state["param_groups"][0]["lr"] == pytest.approx(0.1 * 0.9 ** 16)
    assert all(int(s["step"]) == 16 for s in opt_state["state"].values())
    [sched_state] = final["lr_schedulers"]
    assert sched_state["last_epoch"] == 16
    # the epoch-end checkpoint of the last epoch: two epochs done, nothing left of the third
    assert final["loop"]["epoch"] == 2
    assert final["loop"]["batch"] == 0
    assert final["loop"]["global_step"] == 16
    assert isinstance(final["rng"]["torch"], torch.Tensor)
    best_loss, best_step = min(validations)
    state = final["plugins"]["checkpoint"]
    assert (state["monitor"], state["best_model_score"]) == ("val_loss", best_loss)
    assert state["best_model_path"] == f"epoch={best_step // 8 - 1}-step={best_step}.ckpt"
    assert final["config"]["trainer"]["max_epochs"] == 2
    assert final["config"]["plugins"]["checkpoint"]["every_n_train_steps"] == 11

    # a checkpoint written mid-epoch: epoch 1, after its batch index 2 (global step 11)
    middle = torch.load(mid, weights_only=True)
    assert (middle["loop"]["epoch"], middle["loop"]["batch"], middle["loop"]["global_step"]) == \
        (1, 3, 11)
    assert middle["lr_schedulers"][0]["last_epoch"] == 11


def test_resuming_a_finished_run_continues_from_its_last_epoch(make_trainer):
    torch.manual_seed(0)
    trainer = make_trainer(max_epochs=2, callbacks=QUIET)
    trainer.fit(TinyRegressor())
    assert trainer.global_step == 16
    run_folder = trainer.log_dir

    torch.manual_seed(1)  # other initial weights: the checkpoint must replace them
    again = make_trainer(max_epochs=2, callbacks=QUIET)
    module = TinyRegressor()
    again.fit(module, ckpt_path="last")
    assert again.global_step == 16  # nothing left to do
    assert again.log_dir == run_folder
    for name, value in module.state_dict().items():
        assert torch.equal(value, trainer.module.state_dict()[name])

    more = make_trainer(max_epochs=3, callbacks=QUIET)
    more.fit(TinyRegressor(), ckpt_path="last")
    assert more.global_step == 24 and more.current_epoch == 3


def test_resume_after_a_max_steps_stop_continues_exactly(make_trainer, tmp_path):
    """A run stopped by max_steps in the middle of an epoch (its epoch-end checkpoint is then a
    mid-epoch one) continues, with a larger max_steps, as if it had never stopped."""

    def run(max_steps, root, ckpt_path=None):
        torch.manual_seed(5)
        module = TinyRegressor(shuffle=True, dropout=0.3, optimizer="adam")
        trainer = make_trainer(max_steps=max_steps, seed=0, callbacks=QUIET,
                               default_root_dir=str(root))
        trainer.fit(module, ckpt_path=ckpt_path)
        return module, trainer

    run(13, tmp_path / "stopped")
    state = last_loop_state(tmp_path / "stopped")
    assert (state["epoch"], state["batch"], state["global_step"]) == (1, 5, 13)
    resumed, trainer = run(24, tmp_path / "stopped", ckpt_path="last")
    reference, _ = run(24, tmp_path / "reference")
    assert trainer.global_step == 24
    for a, b in zip(resumed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


class CosineNumpyRegressor(TinyRegressor):
    """A scheduler that computes its learning rates with NumPy (as a course's warm-up cosine
    does): its state and the optimizer's param groups then hold ``np.float64`` values."""

    def configure_optimizers(self):
        import numpy as np

        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: np.float64(0.5 * (1 + np.cos(np.pi * step / 40))))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def test_a_run_whose_scheduler_holds_numpy_numbers_resumes_exactly(make_trainer, tmp_path):
    import numpy as np

    def run(max_epochs, root, ckpt_path=None):
        torch.manual_seed(5)
        module = CosineNumpyRegressor(shuffle=True)
        trainer = make_trainer(max_epochs=max_epochs, seed=0, callbacks=QUIET,
                               default_root_dir=str(root))
        trainer.fit(module, ckpt_path=ckpt_path)
        return module, trainer

    _, first = run(1, tmp_path / "broken")
    assert isinstance(first.optimizers[0].param_groups[0]["lr"], np.float64)
    resumed, trainer = run(2, tmp_path / "broken", ckpt_path="last")
    reference, _ = run(2, tmp_path / "reference")
    assert trainer.global_step == 16
    # the NumPy numbers came back as themselves
    assert isinstance(trainer.lr_schedulers[0]["scheduler"].get_last_lr()[0], np.float64)
    for a, b in zip(resumed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


# -------------------------------------------------------------------------------------------
# Plugin state


class Counter:
    """A stateful plugin: counts training batches across resumes."""

    name = "counter"

    def __init__(self):
        self.batches = 0
        self.events: list[str] = []

    @ptrain.hookimpl
    def on_train_batch_end(self):
        self.batches += 1

    @ptrain.hookimpl
    def state_dict(self):
        self.events.append("state_dict")
        return {"batches": self.batches, "tensor": torch.tensor([self.batches])}

    @ptrain.hookimpl
    def save_checkpoint(self, path):
        self.events.append(f"save_checkpoint:{Path(path).name}")

    @ptrain.hookimpl
    def load_state_dict(self, trainer, state):
        self.events.append("load_state_dict")
        self.loaded = state
        self.batches = state["batches"]

    @ptrain.hookimpl
    def load_checkpoint(self):
        self.events.append("load_checkpoint")

    @ptrain.hookimpl
    def setup(self):
        self.events.append("setup")


def test_stateful_plugin_gets_its_state_back(make_trainer):
    torch.manual_seed(0)
    first = Counter()
    make_trainer(max_epochs=1, callbacks=[*QUIET, first]).fit(TinyRegressor())
    # one checkpoint, at the end of the epoch: every plugin's state first, then the write
    assert first.batches == 8
    assert first.events == ["setup", "state_dict", "save_checkpoint:last.ckpt"]

    second = Counter()
    trainer = make_trainer(max_epochs=2, callbacks=[*QUIET, second])
    trainer.fit(TinyRegressor(), ckpt_path="last")
    assert second.events[:3] == ["load_checkpoint", "load_state_dict", "setup"]
    assert second.loaded["batches"] == 8
    assert torch.equal(second.loaded["tensor"], torch.tensor([8]))
    assert second.batches == 16
    saved = torch.load(trainer.last_checkpoint_path, weights_only=True)
    assert saved["plugins"]["counter"]["batches"] == 16


def test_ckpt_path_auto_starts_once_then_resumes_with_the_same_command(cli, tmp_path):
    """``--ckpt-path auto``: the command a restarted job runs again (torchrun --max-restarts, a
    requeued batch job) starts from scratch when no checkpoint exists, saying so, and resumes
    from the newest ``last.ckpt`` once one does; it is a usage error for evaluation."""
    args = ["fit", "--model", "tests.conftest:TinyRegressor", "--ckpt-path", "auto",
            "--default-root-dir", str(tmp_path), "--no-progress-bar"]
    first = cli(*args, "--max-epochs", "1")
    assert first.returncode == 0, first.stderr
    assert f"ckpt_path='auto': no checkpoint under {tmp_path} yet; training from the start." \
        in " ".join(first.stdout.split()), first.stdout
    again = cli(*args, "--max-epochs", "2")
    assert again.returncode == 0, again.stderr
    assert "Resuming from checkpoint" in again.stdout and "version_0" in again.stdout, again.stdout
    assert torch.load(tmp_path / "version_0" / "checkpoints" / "last.ckpt",
                      weights_only=True)["loop"]["epoch"] == 2
    refused = cli("validate", "--model", "tests.conftest:TinyRegressor", "--ckpt-path", "auto",
                  "--default-root-dir", str(tmp_path))
    assert refused.returncode == 2 and "ckpt_path='auto' is for fit" in refused.stderr
