"""The ``checkpoint`` callback with Lightning's ModelCheckpoint semantics: top-k files by a monitored
metric, filename templates, save_last, step and time triggers, its state across a resume, and
``ckpt_path="best"`` (the ``resolve_ckpt_path`` hook). Real trainings of tiny models; the modules of
``tests._es_models`` log a scripted ``val_metric`` per epoch (2 training batches, 1 validation
batch per epoch)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import yaml

import ptrain
from ptrain import hookimpl
from ptrain.builtins.checkpoint import RECORD, ModelCheckpoint
from ptrain.errors import CheckpointError, CheckpointWriteError, ConfigError, PluginError
from tests._cli_util import assert_ok, assert_usage_error
from tests._ckpt_models import TopKRecorder
from tests._es_models import SequenceModule, StepSequenceModule
from tests.conftest import TinyRegressor, run_cli

QUIET = ["no:progress-bar", "no:tensorboard"]
VALUES = [5, 3, 4, 1, 2, 6]  # val_metric per epoch


def kept(folder: Path) -> list[str]:
    """The top-k files in ``folder`` (everything but last.ckpt and the record)."""
    return sorted(p.name for p in folder.glob("*.ckpt") if p.name != "last.ckpt")


def name(epoch: int, value: float) -> str:
    return f"epoch={epoch}-val_metric={value:.1f}.ckpt"


class FolderSnapshots:
    """What the checkpoint folder holds right after each write and after each epoch's end."""

    name = "snapshots"

    def __init__(self):
        self.after_write: list[tuple[str, list[str]]] = []
        self.after_epoch: list[list[str]] = []

    @hookimpl(wrapper=True)
    def save_checkpoint(self, trainer, path):
        written = yield
        self.after_write.append((Path(path).name, kept(Path(path).parent)))
        return written

    @hookimpl(trylast=True)  # after the checkpoint callback's
    def on_epoch_end(self, trainer):
        self.after_epoch.append(kept(trainer.log_dir / "checkpoints"))


def fit(make_trainer, checkpoint, values=VALUES, extra=(), module=None, **options):
    module = module or SequenceModule(values)
    options.setdefault("max_epochs", len(values))
    trainer = make_trainer(callbacks=[*QUIET, checkpoint, *extra], **options)
    trainer.fit(module)
    return trainer, module


# -- top-k ----------------------------------------------------------------------------------------


def test_top_k_keeps_the_k_best_and_deletes_the_dropped_one_after_the_new_is_written(
        make_trainer):
    snapshots = FolderSnapshots()
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=2,
                               filename="{epoch}-{val_metric:.1f}")
    trainer, _ = fit(make_trainer, callback, extra=[snapshots])
    folder = trainer.log_dir / "checkpoints"
    assert snapshots.after_epoch == [
        [name(0, 5)], [name(0, 5), name(1, 3)], [name(1, 3), name(2, 4)],
        [name(1, 3), name(3, 1)], [name(3, 1), name(4, 2)], [name(3, 1), name(4, 2)]]
    # epoch 2's write happened while the file it replaces was still there
    assert (name(2, 4), [name(0, 5), name(1, 3), name(2, 4)]) in snapshots.after_write
    assert kept(folder) == [name(3, 1), name(4, 2)]
    assert callback.best_model_path == str(folder / name(3, 1))
    assert callback.best_model_score == 1.0
    assert callback.kth_best_model_path == str(folder / name(4, 2)) and callback.kth_value == 2.0
    assert callback.best_k_models == {str(folder / name(3, 1)): 1.0,
                                      str(folder / name(4, 2)): 2.0}
    assert callback.last_model_path == str(folder / "last.ckpt")
    record = json.loads((folder / RECORD).read_text())
    assert record["best_model_path"] == name(3, 1)
    assert record["best_k_models"] == {name(3, 1): 1.0, name(4, 2): 2.0}
    # each file carries the top-k as it was when written, itself included, and its own step
    best = torch.load(folder / name(3, 1), weights_only=True)
    assert best["plugins"]["checkpoint"]["best_k_models"] == {name(1, 3): 3.0, name(3, 1): 1.0}
    assert best["loop"]["global_step"] == 8


def test_every_file_in_the_checkpoint_folder_takes_the_umask(make_trainer):
    """Checkpoints, last.ckpt and the top-k record are made by the umask (here 027: 0640), as
    any file the user's tools write, not 0600 (tempfile's mode before the rename)."""
    previous = os.umask(0o027)
    try:
        trainer, _ = fit(make_trainer, ModelCheckpoint(monitor="val_metric", save_top_k=2))
    finally:
        os.umask(previous)
    folder = trainer.log_dir / "checkpoints"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}
    assert RECORD in modes and "last.ckpt" in modes and len(modes) == 4, modes
    assert set(modes.values()) == {"0o640"}, modes


def test_mode_max_and_save_top_k_all_and_none(make_trainer):
    callback = ModelCheckpoint(monitor="val_metric", mode="max", save_top_k=-1,
                               filename="{epoch}-{val_metric:.1f}")
    trainer, _ = fit(make_trainer, callback, values=[1, 3, 2])
    assert kept(trainer.log_dir / "checkpoints") == [name(0, 1), name(1, 3), name(2, 2)]
    assert Path(callback.best_model_path).name == name(1, 3)
    assert Path(callback.kth_best_model_path).name == name(0, 1)
    none = ModelCheckpoint(monitor="val_metric", save_top_k=0)
    trainer, _ = fit(make_trainer, none, values=[1, 3, 2])
    folder = trainer.log_dir / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    assert none.best_model_path == "" and none.best_model_score is None


def test_top_k_after_each_validation_when_validation_runs_within_the_epoch(make_trainer):
    # val_check_interval 0.5: a validation after each of the 2 batches, so the top-k is decided
    # after validation (as Lightning), once per check
    callback = ModelCheckpoint(monitor="val_metric", filename="{epoch}-{step}-{val_metric:.0f}")
    snapshots = FolderSnapshots()
    trainer, _ = fit(make_trainer, callback, values=[5, 2, 4, 1], extra=[snapshots],
                     module=SequenceModule([5, 2, 4, 1], per_check=True), max_epochs=2,
                     val_check_interval=0.5, num_sanity_val_steps=0)  # it would count a check
    assert snapshots.after_epoch == [["epoch=0-step=2-val_metric=2.ckpt"],
                                     ["epoch=1-step=4-val_metric=1.ckpt"]]
    # last.ckpt follows each top-k file (as Lightning's save_last), and is written again at the
    # epoch's end: that state resumes into the next epoch, with any number of processes
    assert [n for n, _ in snapshots.after_write] == [
        "epoch=0-step=1-val_metric=5.ckpt", "last.ckpt", "epoch=0-step=2-val_metric=2.ckpt",
        "last.ckpt", "last.ckpt", "epoch=1-step=4-val_metric=1.ckpt", "last.ckpt", "last.ckpt"]


@pytest.mark.parametrize("async_save", [False, True])
def test_last_is_written_once_after_the_top_k_file_of_an_epoch_end(make_trainer, async_save):
    # the epoch end's top-k file is followed by last.ckpt, which the epoch end then wrote a
    # second time, of the same state: twice the writing (and, refused, said twice)
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=2, filename="{epoch}",
                               async_save=async_save)
    snapshots = FolderSnapshots()
    fit(make_trainer, callback, values=[5, 3, 4], extra=[snapshots])
    assert [n for n, _ in snapshots.after_write] == [
        "epoch=0.ckpt", "last.ckpt", "epoch=1.ckpt", "last.ckpt", "epoch=2.ckpt", "last.ckpt"]


def test_a_nan_monitored_value_ranks_worst(make_trainer):
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=2,
                               filename="{epoch}")
    trainer, _ = fit(make_trainer, callback, values=[float("nan"), 3, 2])
    assert kept(trainer.log_dir / "checkpoints") == ["epoch=1.ckpt", "epoch=2.ckpt"]
    assert callback.best_model_score == 2.0


def test_fast_dev_run_takes_no_checkpoint(make_trainer, tmp_path):
    callback = ModelCheckpoint(monitor="val_metric")
    fit(make_trainer, callback, values=[1], fast_dev_run=True)
    assert callback.best_model_path == "" and callback.best_k_models == {}
    assert not (tmp_path / "runs").exists()


# -- filenames, save_last, triggers ------------------------------------------------------------


def test_default_filename_and_auto_insert_metric_name(make_trainer):
    callback = ModelCheckpoint(monitor="val_metric")
    trainer, _ = fit(make_trainer, callback, values=[3, 1, 2])
    assert kept(trainer.log_dir / "checkpoints") == ["epoch=1-step=4.ckpt"]
    bare = ModelCheckpoint(monitor="val_metric", filename="best-{epoch:02d}-{val_metric:.2f}",
                           auto_insert_metric_name=False)
    trainer, _ = fit(make_trainer, bare, values=[3, 1, 2])
    assert kept(trainer.log_dir / "checkpoints") == ["best-01-1.00.ckpt"]


def test_a_fixed_filename_is_overwritten_in_place(make_trainer):
    callback = ModelCheckpoint(monitor="val_metric", filename="best")
    trainer, _ = fit(make_trainer, callback, values=[3, 1, 2])
    folder = trainer.log_dir / "checkpoints"
    assert kept(folder) == ["best.ckpt"] and callback.best_model_score == 1.0
    assert torch.load(folder / "best.ckpt", weights_only=True)["loop"]["global_step"] == 4


def test_save_last_is_on_by_default_and_can_be_switched_off(make_trainer, tmp_path):
    on = ModelCheckpoint()
    trainer, _ = fit(make_trainer, on, values=[1, 1])
    folder = trainer.log_dir / "checkpoints"
    # without a monitor, last.ckpt is the newest checkpoint: no second copy, and the "best"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    assert on.last_model_path == on.best_model_path == str(folder / "last.ckpt")
    off = ModelCheckpoint(save_last=False)
    root = str(tmp_path / "no-last")
    trainer, _ = fit(make_trainer, off, values=[1, 1], default_root_dir=root)
    folder = trainer.log_dir / "checkpoints"
    # Lightning's default: the newest checkpoint alone, named by the template
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=1-step=4.ckpt"]
    assert off.best_model_path == str(folder / "epoch=1-step=4.ckpt")
    assert off.last_model_path == ""
    with pytest.raises(CheckpointError, match="save_last is off"):
        make_trainer(max_epochs=3, callbacks=QUIET, default_root_dir=root).fit(
            SequenceModule([1]), ckpt_path="last")


def test_every_n_train_steps_keeps_all_without_a_monitor(make_trainer):
    callback = ModelCheckpoint(save_top_k=-1, every_n_train_steps=3, every_n_epochs=0,
                               save_last=False)
    trainer, _ = fit(make_trainer, callback, values=[1, 1, 1, 1])  # 8 steps
    assert kept(trainer.log_dir / "checkpoints") == ["epoch=1-step=3.ckpt",
                                                     "epoch=2-step=6.ckpt"]


def test_step_triggers_rank_by_the_latest_validation_and_wait_for_the_first(make_trainer):
    # a checkpoint every step; val_metric exists from the end of epoch 0 (step 2) on
    callback = ModelCheckpoint(monitor="val_metric", every_n_train_steps=1, every_n_epochs=0)
    snapshots = FolderSnapshots()
    trainer, _ = fit(make_trainer, callback, values=[3, 1, 2], extra=[snapshots])
    assert [n for n, _ in snapshots.after_write] == [
        "last.ckpt", "epoch=0-step=2.ckpt", "last.ckpt", "last.ckpt",
        "epoch=1-step=4.ckpt", "last.ckpt", "last.ckpt", "last.ckpt"]
    assert kept(trainer.log_dir / "checkpoints") == ["epoch=1-step=4.ckpt"]
    misspelt = ModelCheckpoint(monitor="val_metrc", every_n_train_steps=1, every_n_epochs=0)
    with pytest.raises(ConfigError, match="'val_metrc' was not logged.*val_metric"):
        fit(make_trainer, misspelt, values=[3, 1, 2])


def test_a_training_metric_without_validation_is_ranked_at_epoch_end(make_trainer):
    # no validation: the top-k is decided at the end of each training epoch, where the epoch-level
    # train_metric is published. The step trigger on each epoch's last batch sees the previous
    # epoch's value (or none yet) and must not stop the epoch end from ranking the new one.
    callback = ModelCheckpoint(monitor="train_metric", every_n_train_steps=2)
    module = SequenceModule(train_values=[3, 1, 2], with_val=False)
    trainer, _ = fit(make_trainer, callback, values=[3, 1, 2], module=module)
    assert kept(trainer.log_dir / "checkpoints") == ["epoch=1-step=4.ckpt"]
    assert callback.best_model_score == 1.0


class SlowSteps(SequenceModule):
    def training_step(self, batch, batch_idx):
        time.sleep(0.06)
        return super().training_step(batch, batch_idx)


def test_train_time_interval(make_trainer):
    callback = ModelCheckpoint(save_top_k=-1, train_time_interval=0.05, every_n_epochs=0,
                               save_last=False, filename="{step}")
    trainer, _ = fit(make_trainer, callback, values=[1, 1], module=SlowSteps([1, 1]))
    # each step takes longer than the interval: a checkpoint after every optimizer step
    assert kept(trainer.log_dir / "checkpoints") == [f"step={s}.ckpt" for s in (1, 2, 3, 4)]
    never = ModelCheckpoint(save_top_k=-1, train_time_interval="00:01:00:00", every_n_epochs=0,
                            save_last=False)
    assert never.train_time_interval == 3600.0
    trainer, _ = fit(make_trainer, never, values=[1, 1])
    assert not (trainer.log_dir / "checkpoints").exists()


# -- resume and ckpt_path="best" -----------------------------------------------------------------


def test_a_resumed_run_continues_the_same_top_k(make_trainer):
    first = ModelCheckpoint(monitor="val_metric", save_top_k=2,
                            filename="{epoch}-{val_metric:.1f}")
    trainer, _ = fit(make_trainer, first, max_epochs=3)
    folder = trainer.log_dir / "checkpoints"
    assert kept(folder) == [name(1, 3), name(2, 4)]
    second = ModelCheckpoint(monitor="val_metric", save_top_k=2,
                             filename="{epoch}-{val_metric:.1f}")
    resumed = make_trainer(callbacks=[*QUIET, second], max_epochs=6)
    resumed.fit(SequenceModule(VALUES), ckpt_path="last")
    assert resumed.log_dir == trainer.log_dir
    # files of the first process were dropped by the second as they fell out of the top 2
    assert kept(folder) == [name(3, 1), name(4, 2)]
    assert second.best_k_models == {str(folder / name(3, 1)): 1.0,
                                    str(folder / name(4, 2)): 2.0}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def _assert_weights(module: torch.nn.Module, path: Path) -> None:
    expected = _weights(path)
    for key, value in module.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_validate_best_loads_the_best_file(make_trainer):
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=2)
    trainer, module = fit(make_trainer, callback, values=[3, 1, 2, 4])
    best = Path(callback.best_model_path)
    assert best.name == "epoch=1-step=4.ckpt"
    assert not torch.equal(module.net[1].weight, _weights(best)["net.1.weight"])
    trainer.validate(module, ckpt_path="best")  # from the callback's own state
    _assert_weights(module, best)
    # a new trainer (a new process, say) reads the newest run's record
    other = SequenceModule([0])
    make_trainer(callbacks=QUIET).validate(other, ckpt_path="best")
    _assert_weights(other, best)


def test_best_without_a_monitored_checkpoint_is_an_error(make_trainer):
    fit(make_trainer, ModelCheckpoint(), values=[1])
    with pytest.raises(CheckpointError, match="found no best checkpoint.*--checkpoint-monitor"):
        make_trainer(callbacks=QUIET).validate(SequenceModule([1]), ckpt_path="best")
    with pytest.raises(CheckpointError, match="no:checkpoint"):
        make_trainer(callbacks=[*QUIET, "no:checkpoint"]).validate(
            SequenceModule([1]), ckpt_path="best")


class AliasPaths:
    """A plugin that answers its own word for ``ckpt_path``."""

    name = "alias"

    def __init__(self, target: Path):
        self.target = target

    @hookimpl
    def resolve_ckpt_path(self, trainer, ckpt_path):
        return str(self.target) if ckpt_path == "first-run" else None


def test_resolve_ckpt_path_can_be_answered_by_a_plugin(make_trainer):
    trainer, _ = fit(make_trainer, ModelCheckpoint(), values=[1])
    module = SequenceModule([1])
    make_trainer(callbacks=[*QUIET, AliasPaths(trainer.last_checkpoint_path)]).validate(
        module, ckpt_path="first-run")
    _assert_weights(module, trainer.last_checkpoint_path)


# -- a callback object replaces the default one -----------------------------------------------


def test_a_checkpoint_object_replaces_the_default_callback(make_trainer):
    callback = ModelCheckpoint(monitor="val_loss", save_top_k=2)
    trainer = make_trainer(callbacks=[callback])
    assert trainer.plugins["checkpoint"] is callback
    with pytest.raises(ConfigError, match="given as an object"):
        make_trainer(callbacks=[callback], plugin_options={"checkpoint": {"save_top_k": 1}})
    with pytest.raises(PluginError, match="both named 'checkpoint'"):
        make_trainer(callbacks=["checkpoint", callback])


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,needles", [
    ({"save_top_k": 2}, ["save_top_k=2 needs a monitor", "-1", "--checkpoint-monitor"]),
    ({"save_top_k": -2, "monitor": "x"}, ["save_top_k=-2 is not valid"]),
    ({"mode": "avg"}, ["'avg'", "min, max"]),
    ({"every_n_train_steps": -1}, ["every_n_train_steps=-1"]),
    ({"train_time_interval": "1 hour"}, ["DD:HH:MM:SS"]),
    ({"filename": "x.ckpt"}, ["without the .ckpt extension"]),
    ({"save_last": "sometimes"}, ["save_last", "'sometimes'", "'link'"]),
])
def test_bad_options_from_python(kwargs, needles):
    with pytest.raises(ConfigError) as info:
        ModelCheckpoint(**kwargs)
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("flags,needles", [
    (["--checkpoint-filename", "{epoch}-{val_acc:.2f}"],
     ["'val_acc'", "not logged", "val_loss", "train_loss", "--checkpoint-filename"]),
    (["--checkpoint-save-top-k", "3"], ["save_top_k=3 needs a monitor", "--checkpoint-monitor"]),
    (["--checkpoint-monitor", "val_acc"], ["'val_acc' was not logged", "val_loss"]),
    # the flag and the config key are named, not a source the option can't know (a flag here)
    (["--checkpoint-monitor", "val_loss", "--checkpoint-mode", "avg"],
     ["'avg' for --checkpoint-mode (config key 'mode' in [plugins.checkpoint]); valid "
      "choices: min, max"]),
    # link is valid too: named with true and false
    (["--checkpoint-save-last", "maybe"],
     ["--checkpoint-save-last", "expected true, false or link", "got str 'maybe'"]),
], ids=["filename-metric", "top-k-without-monitor", "monitor", "mode", "save-last"])
def test_usage_errors_through_the_cli(tmp_path, flags, needles):
    result = run_cli("fit", "--model", "tests.conftest:TinyRegressor", "--max-epochs", "1",
                     "--default-root-dir", str(tmp_path), "--no-progress-bar", *flags)
    message = assert_usage_error(result, *needles)
    assert message.count("\n") == 1, message  # one paragraph


@pytest.mark.slow
def test_cli_fit_and_validate_with_best(tmp_path):
    common = ["--model", "tests._es_models:SequenceModule", "--model.val_values", "[5, 1, 4, 3]",
              "--default-root-dir", str(tmp_path)]
    assert_ok(run_cli("fit", *common, "--max-epochs", "4", "--checkpoint-monitor", "val_metric",
                      "--no-progress-bar"))
    folder = tmp_path / "version_0" / "checkpoints"
    assert kept(folder) == ["epoch=1-step=4.ckpt"]
    result = run_cli("validate", *common, "--ckpt-path", "best")
    assert_ok(result)
    module = TinyRegressor(n=16, batch_size=8, val_n=8)
    module.load_state_dict(_weights(folder / "epoch=1-step=4.ckpt"))
    x, y = module.val_set.tensors
    expected = torch.nn.functional.mse_loss(module(x), y).item()
    assert float(result.stdout.split("val_loss=")[1].split()[0]) == pytest.approx(expected,
                                                                                  rel=1e-3)
    # fit from the best (epoch 1) starts a new run that says where it came from: epoch 2 is
    # trained again there, and the first run's history (its last.ckpt, epoch 4) is untouched
    before = (folder / "last.ckpt").read_bytes()
    assert_ok(run_cli("fit", *common, "--max-epochs", "3", "--checkpoint-monitor", "val_metric",
                      "--ckpt-path", "best", "--no-progress-bar"))
    assert (folder / "last.ckpt").read_bytes() == before
    new_run = tmp_path / "version_1"
    origin = json.loads((new_run / "resumed_from.json").read_text())
    assert origin["checkpoint"] == str((folder / "epoch=1-step=4.ckpt").resolve())
    last = torch.load(new_run / "checkpoints" / "last.ckpt", weights_only=True)["loop"]
    assert (last["epoch"], last["global_step"]) == (3, 6)


class BlockRecord:
    """After the first epoch's checkpoint, makes the top-k record's path a folder: its next
    write is refused (EISDIR), once the checkpoint it ranks is written."""

    name = "block-record"

    def __init__(self, folder: Path):
        self.folder, self.blocked = folder, False

    @hookimpl(trylast=True)  # after the checkpoint callback's
    def on_epoch_end(self, trainer):
        if not self.blocked:
            self.blocked = True
            (self.folder / RECORD).unlink()
            (self.folder / RECORD).mkdir()


def test_a_refused_top_k_record_names_the_checkpoint_to_resume_from(make_trainer, tmp_path):
    folder = tmp_path / "ckpts"
    callback = ModelCheckpoint(dirpath=folder, monitor="val_metric", save_top_k=2)
    with pytest.raises(CheckpointWriteError) as refused:
        fit(make_trainer, callback, extra=[BlockRecord(folder)])
    message = str(refused.value)
    assert message.startswith(f"could not write the top-k record '{folder / RECORD}': "), message
    # it said: resume with --ckpt-path '.../best_k_models.json', which is no checkpoint
    assert f"resume with --ckpt-path '{folder / 'last.ckpt'}'" in message, message
    assert f"--ckpt-path '{folder / RECORD}'" not in message, message
    assert "--checkpoint-on-write-error warn" in message, message
    make_trainer(callbacks=QUIET).validate(SequenceModule(VALUES),
                                           ckpt_path=str(folder / "last.ckpt"))


# -- two ddp ranks --------------------------------------------------------------------------------


@pytest.mark.slow
def test_ddp_ranks_agree_on_the_top_k(make_trainer, tmp_path):
    # the ranks log different values; their mean is VALUES, which alone decides the top-k
    offset = [4, -2, 3, 0, 1, -5]
    per_rank = [[v + o for v, o in zip(VALUES, offset)], [v - o for v, o in zip(VALUES, offset)]]
    records = tmp_path / "records"
    records.mkdir()
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=2,
                               filename="{epoch}-{val_metric:.1f}")
    trainer = make_trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=len(VALUES),
                           callbacks=[*QUIET, callback, TopKRecorder(str(records))],
                           plugin_options={"ddp": {"timeout": 120.0}})
    trainer.fit(SequenceModule(per_rank, per_rank=True))
    folder = trainer.log_dir / "checkpoints"
    assert kept(folder) == [name(3, 1), name(4, 2)]
    expected = {"best_k_models": {name(3, 1): 1.0, name(4, 2): 2.0},
                "best_model_path": name(3, 1), "kth_best_model_path": name(4, 2),
                "best_model_score": 1.0}
    for rank in (0, 1):
        assert json.loads((records / f"rank{rank}.json").read_text()) == expected
    assert json.loads((folder / RECORD).read_text())["best_model_path"] == name(3, 1)
    # the launching process held no callback state: "best" comes from the run's record
    module = SequenceModule([0])
    make_trainer(callbacks=QUIET).validate(module, ckpt_path="best")
    _assert_weights(module, folder / name(3, 1))


@pytest.mark.slow
def test_ddp_ranks_agree_on_a_step_metric_at_step_triggers(make_trainer, tmp_path):
    # a step trigger comes between two publish points (log_every_n_steps), where each rank's
    # callback_metrics held its own step value: the ranks ranked and named the files each by
    # their own (with save_top_k=2 they then took different decisions, and the job hung in the
    # save's collective); the mean of the ranks' values decides, as a publish point's would
    means = [5, 3, 4, 1, 2, 6, 7, 8]  # per optimizer step; 4 steps per epoch on each rank
    offset = [4, -2, 3, 0.5, 1, -5, 2, -3]
    per_rank = [[v + o for v, o in zip(means, offset)], [v - o for v, o in zip(means, offset)]]
    records = tmp_path / "records"
    records.mkdir()
    callback = ModelCheckpoint(monitor="train_metric", save_top_k=-1, every_n_epochs=0,
                               every_n_train_steps=1, filename="{step}-{train_metric:.1f}")
    trainer = make_trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=2,
                           log_every_n_steps=50,
                           callbacks=[*QUIET, callback, TopKRecorder(str(records))],
                           plugin_options={"ddp": {"timeout": 120.0}})
    trainer.fit(StepSequenceModule(per_rank, n=64, batch_size=8))
    files = {f"step={step}-train_metric={value:.1f}.ckpt": float(value)
             for step, value in enumerate(means, start=1)}
    assert kept(trainer.log_dir / "checkpoints") == sorted(files)
    for rank in (0, 1):
        record = json.loads((records / f"rank{rank}.json").read_text())
        assert record["best_k_models"] == files, rank
        assert record["best_model_path"] == "step=4-train_metric=1.0.ckpt", rank


# -- dirpath, weights-only files, "best" without a monitor -----------------------------------------


def test_dirpath_holds_the_files_and_another_runs_files_are_not_overwritten(make_trainer,
                                                                            tmp_path):
    folder = tmp_path / "shared"
    named = dict(dirpath=folder, monitor="val_metric", save_top_k=1,
                 filename="{epoch}-{val_metric:.1f}")
    first = ModelCheckpoint(**named)
    trainer, _ = fit(make_trainer, first, values=[3, 2])
    assert first.dirpath == str(folder)
    assert sorted(p.name for p in folder.glob("*.ckpt")) == [name(1, 2), "last.ckpt"]
    assert not (trainer.log_dir / "checkpoints").exists()
    before = {p.name: p.read_bytes() for p in folder.glob("*.ckpt")}
    # a second run into the same folder, with the same names: its files get -v1
    second = ModelCheckpoint(**named)
    fit(make_trainer, second, values=[3, 2], default_root_dir=str(tmp_path / "other"))
    assert {p.name: p.read_bytes() for p in folder.glob("*.ckpt")
            if p.name in before} == before
    assert Path(second.best_model_path).name == name(1, 2).replace(".ckpt", "-v1.ckpt")
    assert Path(second.last_model_path).name == "last-v1.ckpt"
    # "last" finds this callback's newest last*.ckpt in its folder
    resumed = ModelCheckpoint(**named)
    trainer = make_trainer(max_epochs=3, callbacks=[*QUIET, resumed],
                           default_root_dir=str(tmp_path / "third"))
    assert trainer.resolve_ckpt_path("last") == Path(second.last_model_path)
    assert trainer.resolve_ckpt_path("best") == Path(folder / name(1, 2).replace(
        ".ckpt", "-v1.ckpt"))


def test_best_without_a_monitor_is_the_newest_checkpoint(make_trainer):
    callback = ModelCheckpoint()
    trainer, module = fit(make_trainer, callback, values=[1, 1])
    assert callback.best_model_path == str(trainer.log_dir / "checkpoints" / "last.ckpt")
    other = SequenceModule([1])
    trainer.validate(other, ckpt_path="best")
    assert trainer.ckpt_path == callback.best_model_path
    _assert_weights(other, Path(callback.best_model_path))


def assert_said_by_the_callback(said, words: str) -> None:
    """The warning holding ``words`` is located in the checkpoint callback's own module, whose
    package the CLI names as its source (``ptrain: warning: ...``), not in pluggy's hook
    machinery that called the callback (``ptrain: warning from pluggy: ...``)."""
    import ptrain.builtins.checkpoint as module

    [where] = {w.filename for w in said if words in str(w.message)}
    assert where == module.__file__, where


def test_weights_only_files_load_for_evaluation_and_the_full_state_is_kept(make_trainer):
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=1, save_last=False,
                               save_weights_only=True)
    with pytest.warns(UserWarning, match="weights only.*full training state.*last.ckpt") as said:
        trainer, module = fit(make_trainer, callback, values=[3, 2, 4])
    assert_said_by_the_callback(said, "weights only")
    folder = trainer.log_dir / "checkpoints"
    best = torch.load(callback.best_model_path, weights_only=True)
    assert best["weights_only"] is True and best["optimizers"] == []
    assert "rng" not in best and best["plugins"] == {}
    assert set(best["model"]) == set(module.state_dict())
    # the full state is in the run folder's last.ckpt (save_last is off): fit resumes it
    full = torch.load(folder / "last.ckpt", weights_only=True)
    assert full["optimizers"] and "rng" in full
    # the weights-only file evaluates; fit refuses it, saying where the full state is
    other = SequenceModule([1])
    trainer.validate(other, ckpt_path="best")
    _assert_weights(other, Path(callback.best_model_path))
    with pytest.raises(CheckpointError, match="weights only.*ckpt_path='last'"):
        make_trainer(max_epochs=4, callbacks=QUIET).fit(SequenceModule([1]),
                                                        ckpt_path=callback.best_model_path)
    resumed = make_trainer(max_epochs=4, callbacks=QUIET)
    resumed.fit(SequenceModule([3, 2, 4, 1]), ckpt_path=str(folder / "last.ckpt"))
    assert resumed.current_epoch == 4


# -- save_on_exception, save_last="link", enable_version_counter, epoch/step, verbose -----------


class FailsAt(SequenceModule):
    """Raises ``error`` after the optimizer step of training batch ``batch`` of ``epoch``."""

    def __init__(self, epoch: int, batch: int, error: BaseException, **kwargs):
        super().__init__(**kwargs)
        self.fail_epoch, self.fail_batch, self.error = epoch, batch, error

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if (self.trainer.current_epoch, batch_idx) == (self.fail_epoch, self.fail_batch):
            raise self.error


def test_save_on_exception_writes_the_state_at_the_error_and_keeps_last(make_trainer):
    callback = ModelCheckpoint(save_on_exception=True)
    trainer = make_trainer(callbacks=[*QUIET, callback], max_epochs=3)
    with pytest.warns(UserWarning, match="RuntimeError: broken.*epoch=1-step=3.ckpt.*not among "
                                         "the top-k.*last.ckpt still holds") as said:
        with pytest.raises(RuntimeError, match="broken"):
            trainer.fit(FailsAt(1, 0, RuntimeError("broken"), val_values=[1]))
    assert_said_by_the_callback(said, "not among the top-k")
    folder = trainer.run_dir / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=1-step=3.ckpt", "last.ckpt"]
    at_error = torch.load(folder / "epoch=1-step=3.ckpt", weights_only=True)
    assert at_error["loop"]["global_step"] == 3 and at_error["loop"]["batch"] == 1
    assert torch.load(folder / "last.ckpt", weights_only=True)["loop"]["global_step"] == 2
    assert callback.best_k_models == {} and callback.last_model_path == str(folder / "last.ckpt")
    # it resumes: the rest of epoch 1 and epoch 2
    resumed = make_trainer(callbacks=QUIET, max_epochs=3)
    resumed.fit(SequenceModule([1]), ckpt_path=str(folder / "epoch=1-step=3.ckpt"))
    assert resumed.global_step == 6


def test_save_on_exception_writes_nothing_after_a_non_finite_loss(make_trainer):
    class GoesNaN(SequenceModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if self.trainer.current_epoch == 1 else loss

    callback = ModelCheckpoint(save_on_exception=True)
    trainer = make_trainer(callbacks=[*QUIET, callback], max_epochs=3)
    with pytest.warns(UserWarning, match="not written: the loss went non-finite.*last.ckpt") \
            as said:
        with pytest.raises(ptrain.NonFiniteLossError):
            trainer.fit(GoesNaN([1]))
    assert_said_by_the_callback(said, "not written")
    assert sorted(p.name for p in (trainer.run_dir / "checkpoints").iterdir()) == ["last.ckpt"]


def test_save_on_exception_needs_a_step_trained_since_the_last_save(make_trainer, tmp_path):
    # the error comes right after the epoch-end save (at step 2): nothing new to save
    callback = ModelCheckpoint(save_on_exception=True, dirpath=tmp_path / "c", save_last=False,
                               save_top_k=-1)
    trainer = make_trainer(callbacks=[*QUIET, callback], max_epochs=2)

    class FailsAtEpochStart(SequenceModule):
        def on_train_epoch_start(self):
            if self.trainer.current_epoch == 1:
                raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        trainer.fit(FailsAtEpochStart([1]))
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["epoch=0-step=2.ckpt"]


def test_save_last_link_points_at_the_newest_top_k_file_and_resumes(make_trainer):
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=2, save_last="link",
                               filename="{epoch}-{val_metric:.1f}")
    trainer, _ = fit(make_trainer, callback)
    folder = trainer.run_dir / "checkpoints"
    last = folder / "last.ckpt"
    assert last.is_symlink() and not os.path.isabs(os.readlink(last))
    # epoch 5 (6.0) did not enter the top 2: last.ckpt is the newest file written, epoch 4's
    assert os.readlink(last) == name(4, 2)
    assert kept(folder) == [name(3, 1), name(4, 2)]
    resumed = make_trainer(callbacks=QUIET, max_epochs=6)
    resumed.fit(SequenceModule(VALUES), ckpt_path="last")
    assert resumed.ckpt_path == str(last) and resumed.global_step == 12


def _kinds(folder: Path) -> dict[str, str]:
    """Each file in ``folder``: ``"file"``, or ``"link to NAME"``."""
    return {p.name: f"link to {os.readlink(p)}" if p.is_symlink() else "file"
            for p in folder.iterdir()}


def test_save_last_link_resumed_leaves_the_files_of_an_uninterrupted_run(make_trainer,
                                                                        tmp_path):
    def callback():
        return ModelCheckpoint(monitor="val_metric", save_top_k=2, save_last="link",
                               filename="{epoch}-{val_metric:.1f}")

    whole, _ = fit(make_trainer, callback(), default_root_dir=str(tmp_path / "whole"))
    # stopped after epoch 4; epoch 5 (6.0) writes no top-k file: last.ckpt links to epoch 4's
    fit(make_trainer, callback(), max_epochs=5, default_root_dir=str(tmp_path / "parts"))
    resumed = make_trainer(callbacks=[*QUIET, callback()], max_epochs=len(VALUES),
                           default_root_dir=str(tmp_path / "parts"))
    resumed.fit(SequenceModule(VALUES), ckpt_path="last")
    kinds = _kinds(resumed.run_dir / "checkpoints")
    assert kinds == _kinds(whole.run_dir / "checkpoints"), kinds
    assert kinds["last.ckpt"] == f"link to {name(4, 2)}"


def test_link_or_copy_replaces_what_is_there_and_copies_where_links_fail(tmp_path, monkeypatch):
    from ptrain.builtins import checkpoint

    (tmp_path / "a.ckpt").write_text("a")
    (tmp_path / "b.ckpt").write_text("b")
    (tmp_path / "last.ckpt").write_text("an old file")
    assert checkpoint.link_or_copy(tmp_path / "a.ckpt", tmp_path / "last.ckpt")
    assert os.readlink(tmp_path / "last.ckpt") == "a.ckpt"
    assert checkpoint.link_or_copy(tmp_path / "b.ckpt", tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").read_text() == "b"

    def refuse(*args, **kwargs):
        raise OSError("no links here")

    monkeypatch.setattr(checkpoint.os, "symlink", refuse)
    monkeypatch.setattr(checkpoint.os, "link", refuse)
    assert not checkpoint.link_or_copy(tmp_path / "a.ckpt", tmp_path / "last.ckpt")
    assert not (tmp_path / "last.ckpt").is_symlink()
    assert (tmp_path / "last.ckpt").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "b.ckpt", "last.ckpt"]


def test_without_the_version_counter_another_runs_files_are_replaced_and_said(make_trainer,
                                                                             tmp_path):
    named = dict(dirpath=tmp_path / "shared", monitor="val_metric", save_top_k=1,
                 filename="best", enable_version_counter=False)
    fit(make_trainer, ModelCheckpoint(**named), values=[3, 2])
    before = (tmp_path / "shared" / "best.ckpt").read_bytes()
    with pytest.warns(UserWarning, match="best.ckpt was there before this run and is replaced"):
        fit(make_trainer, ModelCheckpoint(**named), values=[3, 1, 2],
            default_root_dir=str(tmp_path / "other"))
    assert sorted(p.name for p in (tmp_path / "shared").glob("*.ckpt")) == ["best.ckpt",
                                                                           "last.ckpt"]
    assert (tmp_path / "shared" / "best.ckpt").read_bytes() != before


def test_epoch_and_step_can_be_monitored_and_named_without_being_logged(make_trainer):
    callback = ModelCheckpoint(monitor="step", mode="max", save_top_k=2, filename="s{step}")
    trainer, _ = fit(make_trainer, callback, values=[1, 1, 1])
    assert kept(trainer.run_dir / "checkpoints") == ["sstep=4.ckpt", "sstep=6.ckpt"]
    assert callback.best_model_score == 6 and callback.current_score == 6


def test_verbose_prints_each_top_k_decision(make_trainer, capsys):
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=1, verbose=True)
    fit(make_trainer, callback, values=[3, 1, 2])
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("checkpoint:")]
    assert len(lines) == 3
    assert "val_metric = 3 is among the best 1" in lines[0] and "saved" in lines[0]
    assert "val_metric = 2 is not among the best 1; nothing saved" in lines[2]


def test_to_yaml_and_format_checkpoint_name(make_trainer, tmp_path):
    callback = ModelCheckpoint(monitor="val_metric", save_top_k=2,
                               filename="{epoch}-{val_metric:.1f}")
    trainer, _ = fit(make_trainer, callback, values=[3, 1, float("nan")])
    callback.to_yaml()
    table = yaml.safe_load((trainer.run_dir / "checkpoints" / "best_k_models.yaml").read_text())
    assert {Path(k).name: v for k, v in table.items()} == {name(0, 3): 3.0, name(1, 1): 1.0}
    assert callback.format_checkpoint_name({"epoch": 7, "val_metric": torch.tensor(0.25)},
                                           ver=2) == str(trainer.run_dir / "checkpoints" /
                                                         "epoch=7-val_metric=0.2-v2.ckpt")
    with pytest.raises(ConfigError, match="'val_metric', which was not logged"):
        callback.format_checkpoint_name({"epoch": 7})


def test_save_last_is_written_at_the_end_of_a_fit_whose_triggers_never_came(make_trainer):
    callback = ModelCheckpoint(every_n_epochs=5)
    trainer, _ = fit(make_trainer, callback, values=[1, 1])
    last = torch.load(trainer.run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["loop"]["global_step"] == 4


def test_a_stage_that_writes_nothing_leaves_no_run_folder(make_trainer, tmp_path):
    trainer = make_trainer(callbacks=[*QUIET, "no:checkpoint"], max_epochs=1)
    trainer.fit(SequenceModule([1]))
    assert not (tmp_path / "runs").exists()
    trainer = make_trainer(callbacks=QUIET, max_epochs=1)
    trainer.fit(SequenceModule([1]))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["version_0"]


def test_a_missing_checkpoint_is_also_a_file_not_found_error(make_trainer, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_trainer(callbacks=QUIET).fit(SequenceModule([1]), ckpt_path=str(tmp_path / "x"))
