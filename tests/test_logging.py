"""Logging: TensorBoard scalars (read back with TensorBoard's own reader) and progress output."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import ptrain
from conftest import REPO, TinyRegressor

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class LossRecorder:
    """The loss of every training batch and the val_loss of every validation, as the trainer
    had them."""

    def __init__(self):
        self.train: list[tuple[int, float]] = []  # (global_step after the batch, loss)
        self.val: list[tuple[int, float]] = []

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, loss):
        self.train.append((trainer.global_step, float(loss.detach())))

    @ptrain.hookimpl
    def on_validation_end(self, trainer):
        self.val.append((trainer.global_step, float(trainer.callback_metrics["val_loss"])))


def val_mse(module: TinyRegressor) -> float:
    """The validation loss as TinyRegressor.validation_step averages it, computed by hand."""
    with torch.no_grad():
        module.eval()
        losses = [nn.functional.mse_loss(module(x), y)
                  for x, y in DataLoader(module.val_set, batch_size=8)]
    return float(torch.stack(losses).mean())


class EpochLogging(TinyRegressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        return loss


@pytest.mark.parametrize("k", [1, 2])
def test_tensorboard_scalars(make_trainer, tmp_path, k):
    recorder = LossRecorder()
    torch.manual_seed(0)
    module = EpochLogging()  # 8 batches per epoch, 2 validation batches
    every, epochs = 3, 2
    trainer = make_trainer(max_epochs=epochs, log_every_n_steps=every, val_check_interval=0.5,
                           accumulate_grad_batches=k,
                           callbacks=["no:progress-bar", "no:checkpoint", recorder])
    trainer.fit(module)

    assert trainer.log_dir == tmp_path / "runs" / "version_0"
    assert list(trainer.log_dir.glob("events.out.tfevents.*"))
    logged = scalars(trainer.log_dir)
    assert set(logged) == {"train_loss", "val_loss", "epoch_loss"}

    steps_per_epoch = 8 // k
    epoch_ends = [steps_per_epoch * (e + 1) for e in range(epochs)]
    # train_loss: every `every` optimizer steps, and at the end of each epoch; the value is the
    # loss of the batch whose optimizer step reached that global step
    expected_steps = sorted(set(range(every, epoch_ends[-1] + 1, every)) | set(epoch_ends))
    assert [step for step, _ in logged["train_loss"]] == expected_steps
    loss_reaching = {}
    for step, loss in recorder.train:
        loss_reaching.setdefault(step, loss)
    for step, value in logged["train_loss"]:
        assert value == pytest.approx(loss_reaching[step], rel=1e-6, abs=1e-7), step

    # epoch_loss: once per epoch, at its last step, the mean of the epoch's batch losses
    assert [step for step, _ in logged["epoch_loss"]] == epoch_ends
    for epoch, (_, value) in enumerate(logged["epoch_loss"]):
        losses = [loss for _, loss in recorder.train[8 * epoch:8 * (epoch + 1)]]
        assert value == pytest.approx(sum(losses) / len(losses), rel=1e-6)

    # val_loss: once per validation (after batches 4 and 8 of each epoch), at its global step
    val_steps = [s for e in epoch_ends for s in (e - steps_per_epoch // 2, e)]
    assert [step for step, _ in logged["val_loss"]] == val_steps
    assert [step for step, _ in recorder.val] == val_steps
    for (_, value), (_, expected) in zip(logged["val_loss"], recorder.val):
        assert value == pytest.approx(expected, rel=1e-6, abs=1e-7)
    final = logged["val_loss"][-1][1]
    assert abs(final - float(trainer.callback_metrics["val_loss"])) <= 1e-6
    assert abs(final - val_mse(module)) <= 1e-6  # the last validation saw the final weights


def test_each_run_logs_to_its_own_folder(make_trainer, tmp_path):
    for version in range(2):
        torch.manual_seed(version)
        trainer = make_trainer(max_epochs=1, callbacks=["no:progress-bar", "no:checkpoint"])
        module = TinyRegressor(n=16)
        trainer.fit(module)
        assert trainer.log_dir == tmp_path / "runs" / f"version_{version}"
        logged = scalars(trainer.log_dir)
        assert [step for step, _ in logged["val_loss"]] == [2]
        assert abs(logged["val_loss"][0][1] - val_mse(module)) <= 1e-6


class HyperRegressor(TinyRegressor):
    def __init__(self, lr: float = 0.1, deep: bool = True, optim: dict | None = None,
                 note: str | None = None):
        super().__init__(lr=lr, n=16)
        self.save_hyperparameters()


@pytest.mark.parametrize("fail", [False, True])
def test_tensorboard_hparams_session_and_config_text(make_trainer, fail):
    """The hyperparameters are the run's HParams session in its own event file (no second run
    folder), read back with TensorBoard's event reader and hparams plugin metadata."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    class FailAtTheEnd:
        name = "fail-at-the-end"

        @ptrain.hookimpl
        def on_epoch_end(self):
            raise RuntimeError("stop here")

    callbacks = ["no:progress-bar", "no:checkpoint"] + ([FailAtTheEnd()] if fail else [])
    trainer = make_trainer(max_epochs=1, callbacks=callbacks)
    module = HyperRegressor(lr=0.25, optim={"name": "sgd", "betas": [0.9]})
    if fail:
        with pytest.raises(RuntimeError, match="stop here"):
            trainer.fit(module)
    else:
        trainer.fit(module)
    run = trainer.log_dir
    assert [p for p in run.iterdir() if p.is_dir()] == []  # add_hparams would add a folder
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    assert metadata.EXPERIMENT_TAG not in content  # TensorBoard builds it from every run
    start = metadata.parse_session_start_info_plugin_data(
        content[metadata.SESSION_START_INFO_TAG])
    values = {name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
              for name, value in start.hparams.items()}
    assert values == {"lr": 0.25, "deep": True, "optim/name": "sgd", "optim/betas": "[0.9]",
                      "note": "None"}
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    assert end.status == (api_pb2.STATUS_FAILURE if fail else api_pb2.STATUS_SUCCESS)
    (text,) = acc.Tensors("config/text_summary")
    config = text.tensor_proto.string_val[0].decode()
    assert "    [trainer]" in config and "    max_epochs = 1" in config
    if not fail:
        assert [s for s, _ in scalars(run)["val_loss"]] == [2]


# -------------------------------------------------------------------------------------------
# Progress output

MODEL = ["--model", "tests.conftest:TinyRegressor", "--model.n", "32"]  # 4 batches per epoch


def _fit_args(root: Path, *extra: str) -> list[str]:
    return ["fit", *MODEL, "--max-epochs", "2", "--seed", "0", "--accelerator", "cpu",
            "--default-root-dir", str(root), "-p", "no:tensorboard", *extra]


def _final_val_loss(root: Path) -> float:
    checkpoint = torch.load(root / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    module = TinyRegressor(n=32)
    module.load_state_dict(checkpoint["model"])
    return val_mse(module)


def _metrics(line: str) -> dict[str, float]:
    return {name: float(value) for name, value in re.findall(r"(\w+)=(\S+)", line)}


@pytest.mark.slow
def test_plain_progress_lines_without_a_terminal(cli, tmp_path):
    result = cli(*_fit_args(tmp_path / "runs", "--checkpoint-save-top-k", "-1"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    epoch_lines = [line for line in lines if line.startswith("Epoch ")]
    assert len(epoch_lines) == 2, result.stdout
    for number, line in enumerate(epoch_lines):  # from 0, as the checkpoints' names count
        assert line.startswith(f"Epoch {number}/1  batch 4/4  step {4 * (number + 1)}  "), line
        assert line.endswith("done"), line
        # only metrics logged with prog_bar=True: train_loss, not val_loss
        assert set(_metrics(line)) == {"train_loss"}, line
    final = lines[-1]
    assert final.startswith("Training finished: 2 epoch(s), 8 steps in "), final
    # the bar's epochs are the checkpoints' (--checkpoint-save-top-k -1: one file per epoch)
    names = sorted(p.name for p in (tmp_path / "runs" / "version_0" / "checkpoints").iterdir())
    assert names == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"], names
    metrics = _metrics(final)
    assert set(metrics) == {"train_loss", "val_loss"}
    assert metrics["train_loss"] == _metrics(epoch_lines[-1])["train_loss"]
    assert metrics["val_loss"] == pytest.approx(_final_val_loss(tmp_path / "runs"), rel=1e-3)
    assert "\x1b[" not in result.stdout  # no terminal control codes in a log file


@pytest.mark.slow
def test_no_progress_bar_hides_the_bar_not_the_results(cli, tmp_path):
    result = cli(*_fit_args(tmp_path / "runs", "--no-progress-bar"))
    assert result.returncode == 0, result.stderr
    assert "Epoch" not in result.stdout
    final = result.stdout.strip().splitlines()[-1]
    assert final.startswith("Training finished: 2 epoch(s), 8 steps in "), result.stdout
    assert _metrics(final)["val_loss"] == pytest.approx(_final_val_loss(tmp_path / "runs"),
                                                        rel=1e-3)
    # -p no:results silences what is left
    quiet = cli(*_fit_args(tmp_path / "quiet", "--no-progress-bar", "-p", "no:results",
                           "-p", "no:model-summary"))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "", quiet.stdout
    assert (tmp_path / "quiet" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_progress_bar_on_a_terminal(tmp_path):
    pty = pytest.importorskip("pty")
    try:
        import fcntl
        import struct
        import termios

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    except OSError as exc:
        pytest.skip(f"no pseudo-terminal available: {exc}")
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    for name in ("NO_COLOR", "TERM_PROGRAM"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "ptrain", *_fit_args(tmp_path / "runs")],
                            cwd=REPO, stdin=slave, stdout=slave, stderr=slave, env=env,
                            close_fds=True)
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    raw = b"".join(chunks).decode("utf-8", "replace")
    text = ANSI.sub("", raw)
    assert "━" in text  # rich's bar
    assert "\x1b[" in raw  # drawn with terminal control codes
    assert "Epoch 0/1" in text and "Epoch 1/1" in text  # from 0, as every other message
    # the live bar shows the current epoch; each finished epoch stays as one line above it
    assert re.search(r"Epoch 0/1  batch 4/4  step 4  [\d.]+ it/s .*done", text)
    assert re.search(r"Epoch 1/1  batch 4/4  step 8  [\d.]+ it/s .*done", text)
    assert "Epoch 2" not in text
    bar_text = text.split("Training finished")[0]
    assert "train_loss=" in bar_text and "val_loss" not in bar_text  # prog_bar metrics only
    final = text.split("Training finished")[1].splitlines()[0]
    assert final.startswith(": 2 epoch(s), 8 steps in ")
    assert set(_metrics(final)) == {"train_loss", "val_loss"}


class OwnsValues:
    """Calls ``own_values`` after each training step, as a plugin whose step outputs live in
    reused memory (CUDA graphs) does, and records what the store held before and after."""

    name = "owns-values"

    def __init__(self):
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        store = trainer.metrics
        before = store.callback_metrics["train_loss"]
        sum_before = store.epoch_sums["train"]["worst_loss"][0]
        store.own_values()
        after = store.callback_metrics["train_loss"]
        store.own_values()  # a copy already made is not copied again
        assert store.callback_metrics["train_loss"] is after
        self.seen.append((before, after, sum_before, store.epoch_sums["train"]["worst_loss"][0]))


class LogsWorstLoss(TinyRegressor):
    """Also logs an epoch aggregate, whose first running value is the logged tensor itself."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("worst_loss", loss, on_step=False, on_epoch=True, reduce_fx="max")
        return loss


def test_own_values_replaces_what_the_store_holds_with_copies_of_equal_value(tmp_path):
    """Each value logged in the step (and the epoch's running sum) is replaced by a copy with
    its own memory and the same value; the training's published figures are unchanged."""
    plain = ptrain.Trainer(max_epochs=2, default_root_dir=str(tmp_path / "plain"),
                           callbacks=["no:progress-bar", "no:checkpoint"], seed=0)
    plain.fit(LogsWorstLoss(n=32))
    owning = OwnsValues()
    trainer = ptrain.Trainer(max_epochs=2, default_root_dir=str(tmp_path / "owning"),
                             callbacks=["no:progress-bar", "no:checkpoint", owning], seed=0)
    trainer.fit(LogsWorstLoss(n=32))
    assert len(owning.seen) == 8
    for before, after, sum_before, sum_after in owning.seen:
        assert after is not before and after.data_ptr() != before.data_ptr()
        assert torch.equal(after, before)
        assert sum_after is not sum_before and torch.equal(sum_after, sum_before)
    for name in ("train_loss", "worst_loss", "val_loss"):
        assert float(trainer.callback_metrics[name]) == float(plain.callback_metrics[name])
