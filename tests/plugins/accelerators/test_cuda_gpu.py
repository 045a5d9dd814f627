"""The ``cuda`` accelerator on a real GPU (skipped, saying why, where torch sees none).

- the digits example trained on ``cuda`` matches the CPU run (3 epochs, seed 0);
- batches come from pinned host memory and are copied without blocking the host: a recorder
  plugin wraps ``transfer_batch``, checks ``is_pinned()`` before the copy, and runs the copy
  under ``torch.cuda.set_sync_debug_mode("error")``, which makes a synchronizing (blocking)
  host-to-device copy raise;
- the memory figures are logged every epoch, the memory snapshot is written in the run folder
  and loads, ``--cuda-float32-matmul-precision`` is in effect during the run, and a GPU that
  does not exist is a clear usage error;
- a checkpoint written in the background, whose weights are copied on a stream of their own
  while the next step runs, holds its own step's state: the same as a synchronous one's.

Nothing here is faked: the recorder is an ordinary plugin object given to ``Trainer(callbacks=)``.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch

import ptrain
from _cli_util import assert_ok, assert_usage_error
from conftest import DIGITS_CONFIG, run_cli
from ptrain.examples.digits import DigitsClassifier
from tests.conftest import TinyRegressor
from tests.test_async_checkpoints import WideTable, fit_both_ways


def _why_no_gpu() -> str:
    if torch.version.cuda is None and torch.version.hip is None:
        return f"needs a CUDA GPU: this torch {torch.__version__} is a CPU-only build"
    return "needs a CUDA GPU: torch.cuda.is_available() is False (no visible GPU)"


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason=_why_no_gpu() if not torch.cuda.is_available() else ""),
]

GIB = 1024**3
EPOCHS = 3
#: How far the CUDA run may be from the CPU run. Without dropout (see ``fit_digits``) the two runs
#: see the same initial weights and the same batches, so they differ only by float32 rounding
#: (cuBLAS vs CPU kernels; TF32 is off: torch's default "highest" precision is kept).
ACC_TOLERANCE = 0.01  # 1 percentage point of validation accuracy
LOSS_TOLERANCE = 0.02  # absolute, on the validation loss (about 0.2 after 3 epochs)


class Recorder:
    """Records what each hook saw. ``transfer_batch`` is a wrapper around the accelerator's."""

    name = "recorder"

    def __init__(self):
        self.pinned: list[bool] = []
        self.moved_to: list[torch.device] = []
        self.blocking_copies: list[str] = []
        self.logged: list[dict[str, float]] = []
        self.matmul_precision: list[str] = []
        self.peak_gib: float | None = None

    @ptrain.hookimpl(wrapper=True)
    def transfer_batch(self, trainer, batch):
        self.pinned.append(all(t.is_pinned() for t in batch))
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")  # a blocking copy synchronizes: it would raise
        try:
            moved = yield
        except RuntimeError as exc:
            self.blocking_copies.append(str(exc))
            raise
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        self.moved_to.extend({t.device for t in moved})
        return moved

    @ptrain.hookimpl
    def log_metrics(self, metrics, step):
        self.logged.append(dict(metrics, step=step))

    @ptrain.hookimpl
    def on_train_batch_end(self):
        self.matmul_precision.append(torch.get_float32_matmul_precision())


@pytest.fixture(autouse=True)
def restore_torch_globals():
    """The plugin sets process-wide torch settings; leave them as they were for other tests."""
    precision = torch.get_float32_matmul_precision()
    benchmark = torch.backends.cudnn.benchmark
    yield
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.benchmark = benchmark


def fit_digits(accelerator: str, root, callbacks=(), **options):
    """Train the digits example for ``EPOCHS`` epochs with seed 0, weights seeded as the CLI does
    (before the model is built). Dropout is off so the CPU and CUDA runs draw no random numbers
    after the shared initialisation except the data order, which comes from the CPU generator in
    both: a difference between them is then numerical, not a different random stream."""
    trainer = ptrain.Trainer(accelerator=accelerator, max_epochs=EPOCHS, seed=0,
                             default_root_dir=str(root),
                             callbacks=["no:progress-bar", "no:tensorboard", *callbacks],
                             **options)
    ptrain.seed_everything(0)
    module = DigitsClassifier(dropout=0.0)
    trainer.fit(module)
    return trainer


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The CPU and the CUDA run of the example, and what the recorder saw in the CUDA run."""
    root = tmp_path_factory.mktemp("digits")
    cpu = fit_digits("cpu", root / "cpu")
    recorder = Recorder()
    cuda = fit_digits("cuda", root / "cuda", callbacks=[recorder])
    recorder.peak_gib = torch.cuda.max_memory_allocated(cuda.device) / GIB  # since setup_device
    return cpu, cuda, recorder


def test_digits_on_cuda_matches_the_cpu_run(digits):
    cpu, cuda, _ = digits
    assert cuda.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in cuda.module.parameters())
    assert cuda.global_step == cpu.global_step == EPOCHS * math.ceil(1438 / 32)
    cpu_acc, cuda_acc = (float(t.callback_metrics["val_acc"]) for t in (cpu, cuda))
    cpu_loss, cuda_loss = (float(t.callback_metrics["val_loss"]) for t in (cpu, cuda))
    assert cpu_acc > 0.85, cpu_acc  # the comparison is between two runs that learned
    assert abs(cuda_acc - cpu_acc) <= ACC_TOLERANCE, (cpu_acc, cuda_acc)
    assert abs(cuda_loss - cpu_loss) <= LOSS_TOLERANCE, (cpu_loss, cuda_loss)


def test_batches_are_pinned_and_copied_without_blocking(digits):
    _, cuda, recorder = digits
    assert cuda.train_dataloader.pin_memory is True
    assert cuda.val_dataloader.pin_memory is True
    train_batches = EPOCHS * len(cuda.train_dataloader)
    val_batches = EPOCHS * len(cuda.val_dataloader)
    sanity_batches = min(cuda.num_sanity_val_steps, len(cuda.val_dataloader))
    assert len(recorder.pinned) == train_batches + val_batches + sanity_batches
    assert all(recorder.pinned), recorder.pinned.count(False)
    assert recorder.blocking_copies == []
    assert set(recorder.moved_to) == {cuda.device}


def test_memory_figures_are_logged_every_epoch(digits):
    _, cuda, recorder = digits
    names = ("cuda_memory_allocated_gib", "cuda_memory_peak_gib", "cuda_memory_reserved_gib")
    figures = [m for m in recorder.logged if "cuda_memory_peak_gib" in m]
    assert len(figures) == EPOCHS, recorder.logged
    for m in figures:
        allocated, peak, reserved = (m[n] for n in names)
        assert 0 < allocated <= peak <= recorder.peak_gib + 1e-9, m
        assert reserved >= allocated, m
    assert [m["step"] for m in figures] == sorted(m["step"] for m in figures)


def test_pinned_memory_can_be_turned_off(tmp_path):
    recorder = Recorder()
    trainer = ptrain.Trainer(accelerator="cuda", max_epochs=1, limit_train_batches=2,
                             limit_val_batches=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard", recorder],
                             plugin_options={"cuda": {"pin_memory": False}})
    trainer.fit(TinyRegressor())
    assert trainer.train_dataloader.pin_memory is False
    assert recorder.pinned and not any(recorder.pinned)
    assert set(recorder.moved_to) == {trainer.device}


def test_float32_matmul_precision_is_in_effect_during_the_run(tmp_path):
    torch.set_float32_matmul_precision("highest")
    recorder = Recorder()
    trainer = ptrain.Trainer(accelerator="cuda", max_epochs=1, limit_train_batches=3,
                             limit_val_batches=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard", recorder],
                             plugin_options={"cuda": {"float32_matmul_precision": "high"}})
    trainer.fit(TinyRegressor())
    assert recorder.matmul_precision == ["high"] * 3


def test_a_bogus_matmul_precision_lists_the_choices(tmp_path):
    """With a GPU, the availability check passes and the value itself is refused."""
    result = run_cli("fit", "--config", DIGITS_CONFIG, "--accelerator", "cuda",
                     "--default-root-dir", str(tmp_path / "runs"),
                     "--cuda-float32-matmul-precision", "bogus")
    assert_usage_error(result, "--cuda-float32-matmul-precision", "'bogus'", "highest", "high",
                       "medium")
    assert not (tmp_path / "runs").exists()


def test_memory_snapshot_is_written_in_the_run_folder(tmp_path):
    root = tmp_path / "runs"
    result = run_cli("fit", "--config", DIGITS_CONFIG, "--accelerator", "cuda",
                     "--max-epochs", "1", "--limit-train-batches", "3", "--limit-val-batches",
                     "1", "--no-progress-bar", "--default-root-dir", str(root),
                     "--cuda-memory-snapshot", "snap.pickle",
                     "--cuda-memory-snapshot-entries", "1000")
    assert_ok(result)
    path = root / "version_0" / "snap.pickle"
    assert path.is_file(), sorted(root.rglob("*"))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert "segments" in snapshot and snapshot["segments"], sorted(snapshot)
    assert "device_traces" in snapshot
    events = sum(len(trace) for trace in snapshot["device_traces"])
    assert 0 < events <= 1000 * len(snapshot["device_traces"])


def test_a_gpu_index_that_does_not_exist_is_a_config_error(tmp_path):
    count = torch.cuda.device_count()
    trainer = ptrain.Trainer(accelerator="cuda", devices=[count], max_epochs=1,
                             default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard"])
    with pytest.raises(ptrain.ConfigError) as info:
        trainer.fit(TinyRegressor())
    message = str(info.value)
    assert f"GPU {count}" in message and f"{count} GPU(s) are visible" in message
    assert not list((tmp_path).rglob("*.ckpt"))


def test_devices_99_is_a_usage_error(tmp_path):
    """A count of 99 with the default single-device strategy is refused before anything runs."""
    result = run_cli("fit", "--config", DIGITS_CONFIG, "--accelerator", "cuda",
                     "--devices", "99", "--default-root-dir", str(tmp_path / "runs"))
    assert_usage_error(result, "--devices 99")
    assert not list(tmp_path.rglob("*.ckpt"))


def test_more_processes_than_gpus_is_a_usage_error_naming_the_visible_count(tmp_path):
    """``--strategy ddp --devices N+1``: refused before any process starts, naming how many
    GPUs the accelerator sees."""
    count = torch.cuda.device_count()
    result = run_cli("fit", "--config", DIGITS_CONFIG, "--accelerator", "cuda",
                     "--strategy", "ddp", "--devices", str(count + 1), "--ddp-timeout", "60",
                     "--default-root-dir", str(tmp_path / "runs"), timeout=300)
    assert_usage_error(result, f"--devices {count + 1}", f"sees here ({count})")
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_background_checkpoints_hold_their_own_steps_state(tmp_path, manual):
    """A save at every step of a 128 MB table: the copies are issued on a stream of their own
    and the next optimizer step's work waits for them on the device; every file equals the
    synchronous run's."""
    fit_both_ways(tmp_path, WideTable(manual=manual), 1, accelerator="cuda")
