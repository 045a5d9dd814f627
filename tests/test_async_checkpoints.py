"""Asynchronous checkpoints (``--checkpoint-async-save``, issue 38): the files equal synchronous
ones, and a run that is killed, signalled or finds its disk full while a write is in flight
resumes exactly from the last complete checkpoint.

The faults run in their own processes (tests/_async_checkpoint_script.py: a model whose
checkpoint is about 140 MB, so its write is seen in flight); each acts at the first epoch end
after the first where the write just started is still running."""

from __future__ import annotations

from copy import deepcopy
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import ptrain
from ptrain import CheckpointWriteError
from ptrain.checkpoint_io import safe_load
from tests._campaigns import JOB_MODULES
from tests.conftest import REPO, TinyRegressor

pytestmark = [pytest.mark.slow, JOB_MODULES]

SCRIPT = "tests._async_checkpoint_script"
STEPS_PER_EPOCH = 4


@dataclass
class Run:
    root: Path
    code: int
    record: dict
    output: str


def run(action: str, root: Path, resume: bool = False, strategy: str | None = None) -> Run:
    argv = [sys.executable, "-m", SCRIPT, action, str(root), *(["--resume"] if resume else []),
            *(["--strategy", strategy] if strategy else [])]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600,
                          start_new_session=True)  # a kill is of the script's process group
    record = root / "saboteur.json"
    return Run(root, proc.returncode, json.loads(record.read_text()) if record.exists() else {},
               proc.stdout + proc.stderr)


def last(root: Path) -> Path:
    return root / "version_0" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """action -> (its run, the step of last.ckpt right after it, the run resumed from there);
    ``none``: the run nothing happened to."""
    base = tmp_path_factory.mktemp("async-checkpoints")
    done = {"none": (run("none", base / "none"), None, None)}
    for action in ("kill", "sigterm", "fill", "fill-warn"):
        first = run(action, base / action)
        after = safe_load(last(first.root))["loop"]["global_step"]
        resumed = None if action == "fill-warn" else run("none", base / action, resume=True)
        done[action] = (first, after, resumed)
    return done


def assert_resumed_exactly(runs, action: str) -> None:
    resumed, reference = runs[action][2], runs["none"][0]
    assert resumed.code == 0 and resumed.record["ended"] == "complete", resumed.output
    expected = torch.load(reference.root / "final.pt", weights_only=True)
    for name, tensor in torch.load(resumed.root / "final.pt", weights_only=True).items():
        assert torch.equal(tensor, expected[name]), (name, (tensor - expected[name]).abs().max())


def test_a_run_killed_during_a_write_resumes_from_the_last_complete_checkpoint(runs):
    killed, after, _ = runs["kill"]
    assert killed.code == -signal.SIGKILL, killed.output
    # the checkpoint being written never took last.ckpt's place: the one before is whole
    assert after == killed.record["acted_at"] - STEPS_PER_EPOCH
    assert_resumed_exactly(runs, "kill")


def test_a_signal_during_a_write_waits_for_it_then_saves(runs):
    stopped, after, _ = runs["sigterm"]
    assert stopped.code == 3 and stopped.record["ended"] == "Interrupted", stopped.output
    # the signal's save, at the next step, came after the write in flight had ended
    assert after == stopped.record["acted_at"] + 1 == stopped.record["step"]
    assert_resumed_exactly(runs, "sigterm")


def test_a_full_disk_during_a_write_is_reported_at_the_next_step_and_nothing_is_lost(runs):
    """The fill comes as the checkpoint point begins: the write refused is the background
    one."""
    full, after, _ = runs["fill"]
    assert full.code == 3 and full.record["ended"] == "CheckpointWriteError", full.output
    assert full.record["step"] <= full.record["acted_at"] + 1  # said at the next step boundary
    assert "File too large (EFBIG)" in full.record["message"]
    assert "the previous last.ckpt there is intact" in full.record["message"]
    assert after == full.record["acted_at"] - STEPS_PER_EPOCH
    assert not [p for p in last(full.root).parent.iterdir() if p.name.endswith(".tmp")]
    assert_resumed_exactly(runs, "fill")


def test_with_warn_a_full_disk_during_a_write_is_said_and_the_top_k_put_back(runs):
    """Every save after the fill is refused: each is said, training goes on to the end, and
    the top-k, its record and last.ckpt are those of the last files written."""
    full, after, _ = runs["fill-warn"]
    assert full.code == 0 and full.record["ended"] == "complete", full.output
    warnings = [line for line in full.output.splitlines() if "could not write checkpoint" in line]
    assert warnings and all(w.startswith("ptrain: warning:") and "Training goes on" in w
                            for w in warnings), full.output
    folder = last(full.root).parent
    kept = sorted(p.name for p in folder.iterdir())
    assert kept == ["best_k_models.json", "epoch=0-step=4.ckpt", "last.ckpt"]
    assert full.record["best_k_models"] == ["epoch=0-step=4.ckpt"]
    record = json.loads((folder / "best_k_models.json").read_text())
    assert list(record["best_k_models"]) == ["epoch=0-step=4.ckpt"]
    assert after == STEPS_PER_EPOCH


# -- in this process: what async_save writes, and where it can't ------------------------------

def fit_digits(root: Path, **checkpoint) -> ptrain.Trainer:
    from ptrain.examples.digits import DigitsClassifier

    torch.manual_seed(0)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=4, seed=0, default_root_dir=str(root),
                             callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary"],
                             plugin_options={"checkpoint": checkpoint})
    trainer.fit(DigitsClassifier())
    return trainer


def test_background_writes_leave_the_files_and_top_k_of_synchronous_ones(tmp_path):
    """Top 2 by validation loss and last.ckpt: the same files, the same record of the top-k,
    and the same tensors in every file (the host copy is the state at the checkpoint point,
    not a later one)."""
    topk = {"monitor": "val_loss", "save_top_k": 2}
    sync = fit_digits(tmp_path / "sync", **topk)
    background = fit_digits(tmp_path / "async", **topk, async_save=True)
    folders = [Path(t.plugins["checkpoint"].dirpath) for t in (sync, background)]
    names = [sorted(p.name for p in folder.iterdir()) for folder in folders]
    assert names[0] == names[1] == ["best_k_models.json", "epoch=2-step=135.ckpt",
                                    "epoch=3-step=180.ckpt", "last.ckpt"]
    records = [json.loads((folder / "best_k_models.json").read_text()) for folder in folders]
    assert records[0] == records[1]
    for name in names[0][1:]:
        written = [safe_load(folder / name) for folder in folders]
        for part in ("model", "optimizers", "rng"):
            assert_same_tensors(written[0][part], written[1][part], f"{name}: {part}")
        assert written[0]["loop"]["global_step"] == written[1]["loop"]["global_step"]


def assert_same_tensors(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tensors(x, y, f"{where}[{i}]")


class OwnWriter:
    """A plugin that writes the run's checkpoints itself, as a sharding strategy does."""

    name = "own-writer"

    @ptrain.hookimpl
    def save_checkpoint(self, checkpoint, path) -> bool:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint, path)
        return True


def test_where_checkpoints_are_not_the_cores_to_write_async_save_says_so_and_writes_them(
        tmp_path):
    with pytest.warns(UserWarning, match=r"checkpoint async_save=True: this run's checkpoints "
                                         r"are written synchronously, because plugin "
                                         r"'own-writer' writes this run's checkpoints itself"):
        torch.manual_seed(0)
        trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, seed=0,
                                 default_root_dir=str(tmp_path),
                                 callbacks=["no:progress-bar", OwnWriter()],
                                 plugin_options={"checkpoint": {"async_save": True}})
        trainer.fit(TinyRegressor())
    assert Path(trainer.plugins["checkpoint"].last_model_path).is_file()


class BackgroundWriter(OwnWriter):
    """A plugin that writes the run's checkpoints itself, in the background too; it refuses
    the writes of the steps in ``refuse`` as a full disk would."""

    name = "background-writer"

    def __init__(self, refuse: tuple[int, ...] = ()):
        self.refuse, self.threads = refuse, set()

    @ptrain.hookimpl
    def save_checkpoint_in_background(self, trainer, checkpoint, path):
        copy = trainer.copy_for_background(checkpoint)
        step = trainer.global_step

        def write() -> None:
            self.threads.add(threading.current_thread().name)
            if step in self.refuse:
                raise CheckpointWriteError(f"could not write checkpoint {path!r}: refused")
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            torch.save(copy, path)

        return [write]


class ScriptedScore(TinyRegressor):
    """Logs ``score`` = ``SCORES[epoch]`` at each validation."""

    SCORES = [3.0, 1.0, 5.0]

    def validation_step(self, batch, batch_idx):
        self.log("score", self.SCORES[self.current_epoch])


def test_a_plugin_that_writes_checkpoints_writes_them_in_the_background_through_its_hook(
        tmp_path, recwarn):
    writer = BackgroundWriter()
    torch.manual_seed(0)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=2, seed=0,
                             default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard", writer],
                             plugin_options={"checkpoint": {"async_save": True}})
    trainer.fit(TinyRegressor())
    assert writer.threads == {"ptrain-checkpoint-write"}
    assert not [w for w in recwarn if "written synchronously" in str(w.message)]
    written = torch.load(trainer.plugins["checkpoint"].last_model_path, weights_only=True)
    assert written["loop"]["global_step"] == trainer.global_step


class PlanningRecorder(BackgroundWriter):
    """A background writer that records each call of its hook: the path, whether the copy
    shares the module's memory, and whether its function ran."""

    name = "planning-recorder"

    def __init__(self):
        super().__init__()
        self.calls: list[dict] = []

    @ptrain.hookimpl
    def save_checkpoint_in_background(self, trainer, checkpoint, path):
        copy = trainer.copy_for_background(checkpoint)
        call = {"path": path, "step": trainer.global_step, "ran": False,
                "shares": copy["model"]["net.1.weight"].data_ptr()
                == trainer.module.net[1].weight.data_ptr()}
        self.calls.append(call)

        def write() -> None:
            call["ran"] = True
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            torch.save(copy, path)

        return [write]


def test_the_first_background_copy_is_planned_once_and_never_written(tmp_path):
    """Trainer.prepare_background_copies asks the strategy what it would copy after the
    first optimizer step: the hook's copy is then the live tensors, its path os.devnull, and
    its function never runs; the saves after it copy and write as before."""
    recorder = PlanningRecorder()
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=2, seed=0,
                             default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard", recorder],
                             plugin_options={"checkpoint": {"async_save": True}})
    trainer.fit(TinyRegressor())
    planned, *saves = recorder.calls
    assert planned == {"path": os.devnull, "step": 1, "ran": False, "shares": True}
    assert [c["path"] for c in saves].count(os.devnull) == 0 and len(saves) == 2
    assert all(c["ran"] and not c["shares"] for c in saves)
    assert safe_load(saves[-1]["path"])["loop"]["global_step"] == trainer.global_step


def test_an_asynchronous_save_after_fit_is_written_before_it_returns(tmp_path):
    """Outside a stage nothing would finish a background write, and the script may end before
    the writer does (it lost the file, leaving a temporary one): the save is written at once."""
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, seed=0,
                             default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard"])
    trainer.fit(TinyRegressor())
    assert trainer.save_checkpoint(tmp_path / "after.ckpt", asynchronous=True) is False
    assert safe_load(tmp_path / "after.ckpt")["loop"]["global_step"] == 8
    assert not list(tmp_path.glob(".after.ckpt.*"))


class SavesItself(TinyRegressor):
    """Saves in the background itself: at each validation's end (inference mode) and after
    step ``at_step``; with ``listens``, it registers a continuation for each save, which
    collects the write's error (``None``: written) in ``heard``."""

    def __init__(self, root: Path, at_step: int | None = None, listens: bool = False):
        super().__init__()
        self.root, self.at_step, self.listens, self.heard = root, at_step, listens, []

    def _save(self, name: str) -> None:
        assert self.trainer.save_checkpoint(self.root / name, asynchronous=True) is True
        if self.listens:
            self.trainer.after_checkpoint_write(self.heard.append)

    def on_validation_epoch_end(self):
        self._save(f"{self.trainer.stage}-{self.trainer.global_step}.ckpt")

    test_step = TinyRegressor.validation_step
    test_dataloader = predict_dataloader = TinyRegressor.val_dataloader
    on_test_epoch_end = on_predict_epoch_end = on_validation_epoch_end

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.global_step == self.at_step:
            self._save(f"step-{self.at_step}.ckpt")


def trainer_of(root: Path, *plugins, **options) -> ptrain.Trainer:
    return ptrain.Trainer(accelerator="cpu", seed=0, default_root_dir=str(root),
                          callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint",
                                     *plugins], **options)


def test_a_background_save_in_a_validation_leaves_memory_the_next_one_can_copy_into(tmp_path):
    """A validation runs in inference mode, where new tensors are inference tensors; the
    next save, between two steps, copies into the same memory outside it."""
    module = SavesItself(tmp_path, at_step=10)
    trainer_of(tmp_path, max_epochs=2, num_sanity_val_steps=0).fit(module)
    steps = {name: safe_load(tmp_path / name)["loop"]["global_step"]
             for name in ("validate-8.ckpt", "step-10.ckpt", "validate-16.ckpt")}
    assert steps == {"validate-8.ckpt": 8, "step-10.ckpt": 10, "validate-16.ckpt": 16}


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_stage_other_than_fit_returns_with_its_background_save_written(tmp_path, stage):
    module = SavesItself(tmp_path, listens=True)
    getattr(trainer_of(tmp_path), stage)(module)
    assert module.heard == [None]  # the write was finished, on this thread, before returning
    assert safe_load(tmp_path / f"{stage}-0.ckpt")["loop"]["global_step"] == 0
    assert not list(tmp_path.glob(f".{stage}-0.ckpt.*"))


@pytest.mark.parametrize("listens", [False, True], ids=["unheard", "heard"])
def test_a_users_own_background_save_that_fails_is_never_dropped_silently(tmp_path, listens):
    """Nothing waits on the save: its refusal stops the run where its write is finished, as
    the synchronous save would have; a continuation that waits on it gets it instead."""
    module = SavesItself(tmp_path, at_step=3, listens=listens)
    trainer = trainer_of(tmp_path, BackgroundWriter(refuse=(3,)), max_epochs=1,
                         num_sanity_val_steps=0)
    if listens:
        trainer.fit(module)
        assert [type(e) for e in module.heard] == [CheckpointWriteError, type(None)]
    else:
        with pytest.raises(CheckpointWriteError, match="step-3.ckpt.*refused"):
            trainer.fit(module)
    assert not (tmp_path / "step-3.ckpt").exists()


class SignalledAfterItsSave(SavesItself):
    """Saves in the background after step ``at_step``, then is sent SIGTERM at once: the
    stop comes at that same step boundary, with the save's write still unfinished."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.trainer.global_step == self.at_step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_signal_saves_the_run_before_raising_a_users_failed_background_save(
        tmp_path, capfd):
    """The user's save, refused, would stop the run where its write is finished, which is in
    the stop's own save: the run's checkpoint is written first, then the refusal raised."""
    module = SignalledAfterItsSave(tmp_path, at_step=3)
    trainer = trainer_of(tmp_path, BackgroundWriter(refuse=(3,)), max_epochs=1,
                         num_sanity_val_steps=0)
    with pytest.raises(CheckpointWriteError, match="step-3.ckpt.*refused"):
        trainer.fit(module)
    assert not (tmp_path / "step-3.ckpt").exists()
    assert safe_load(trainer.last_checkpoint_path)["loop"]["global_step"] == 3
    err = capfd.readouterr().err
    assert f"SIGTERM: the run was saved to {trainer.last_checkpoint_path} at step 3" in err


class NormedRegressor(TinyRegressor):
    """:class:`TinyRegressor` with a batch norm first: every forward in training changes its
    running statistics."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))


class SavesTwiceAStep:
    """Saves at each batch's end and again in the next batch's on_before_optimizer_step: the
    same global step, after a forward that moved the batch norm's statistics."""

    name = "saves-twice-a-step"

    def __init__(self, root: Path, asynchronous: bool):
        self.root, self.asynchronous = root, asynchronous

    def _save(self, trainer, name: str) -> None:
        trainer.save_checkpoint(self.root / f"{name}-{trainer.global_step}.ckpt",
                                asynchronous=self.asynchronous)

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        self._save(trainer, "end")

    @ptrain.hookimpl
    def on_before_optimizer_step(self, trainer):
        self._save(trainer, "before-step")


def test_two_saves_at_one_step_each_hold_the_state_of_their_own_moment(tmp_path):
    """Only the saves of one checkpoint point (a top-k file and last.ckpt) share a host copy;
    a later save at the same step copies what it writes."""
    folders = []
    for asynchronous in (False, True):
        root = tmp_path / ("async" if asynchronous else "sync")
        root.mkdir()
        trainer_of(root, SavesTwiceAStep(root, asynchronous), max_epochs=1,
                   num_sanity_val_steps=0).fit(NormedRegressor())
        folders.append(root)
    names = sorted(p.name for p in folders[0].glob("*.ckpt"))
    assert len(names) == 8 + 8 and names == sorted(p.name for p in folders[1].glob("*.ckpt"))
    for name in names:
        sync, background = (safe_load(folder / name) for folder in folders)
        assert_same_tensors(sync["model"], background["model"], name)
        assert_same_tensors(sync["optimizers"], background["optimizers"], name)


class RefusesWhileCopying(BackgroundWriter):
    """A background writer that refuses every save while it copies (a full disk it checks
    first), its planning call included."""

    name = "refuses-while-copying"

    @ptrain.hookimpl
    def save_checkpoint_in_background(self, trainer, checkpoint, path):
        raise CheckpointWriteError(f"could not write checkpoint {path!r}: no space left")


def test_a_refusal_while_planning_the_copies_is_left_to_the_saves(tmp_path, capfd):
    """The planning call meets the same refusal as the saves: it leaves it to them, and their
    policy (warn here) decides; the run is not stopped by the planning."""
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=2, seed=0,
                             default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard",
                                        RefusesWhileCopying()],
                             plugin_options={"checkpoint": {"async_save": True,
                                                            "on_write_error": "warn"}})
    trainer.fit(TinyRegressor())
    refusals = [line for line in capfd.readouterr().err.splitlines() if "no space left" in line]
    assert trainer.global_step == 16 and refusals
    assert all("last.ckpt" in line and os.devnull not in line for line in refusals), refusals


def test_after_a_refused_background_write_last_links_to_the_newest_complete_file(tmp_path):
    """Epoch 1's score is the best, and its write is refused (warn): the top-k goes back to
    epoch 0's file, and epoch 2's last.ckpt (its score enters no top-k) links to that file,
    not to the one never written."""
    writer = BackgroundWriter(refuse=(16,))  # epoch 1 ends at step 16 (8 batches an epoch)
    torch.manual_seed(0)
    trainer = ptrain.Trainer(
        accelerator="cpu", max_epochs=3, seed=0, default_root_dir=str(tmp_path),
        callbacks=["no:progress-bar", "no:tensorboard", writer],
        plugin_options={"checkpoint": {"async_save": True, "monitor": "score", "save_top_k": 1,
                                       "save_last": "link", "on_write_error": "warn"}})
    trainer.fit(ScriptedScore())
    callback = trainer.plugins["checkpoint"]
    assert [Path(p).name for p in callback.best_k_models] == ["epoch=0-step=8.ckpt"]
    last_file = Path(callback.dirpath) / "last.ckpt"
    assert last_file.resolve() == (Path(callback.dirpath) / "epoch=0-step=8.ckpt").resolve()
    assert safe_load(last_file)["loop"]["global_step"] == 8


def test_with_warn_a_refused_background_write_is_said_once(tmp_path, capfd):
    """The top-k file of epoch 1 is refused: last.ckpt, after it in the same write, fails with
    its error (it is not tried). The refusal is said once for the two saves, and epoch 2's
    write, complete, says that checkpoints are saved again."""
    writer = BackgroundWriter(refuse=(16,))  # epoch 1 ends at step 16 (8 batches an epoch)
    trainer = ptrain.Trainer(
        accelerator="cpu", max_epochs=3, seed=0, default_root_dir=str(tmp_path),
        callbacks=["no:progress-bar", "no:tensorboard", writer],
        plugin_options={"checkpoint": {"async_save": True, "monitor": "score", "save_top_k": 1,
                                       "on_write_error": "warn"}})
    trainer.fit(ScriptedScore())
    said = [line for line in capfd.readouterr().err.splitlines() if "refused" in line]
    assert len(said) == 2 and "epoch=1-step=16.ckpt" in said[0], said
    assert said[0].startswith("ptrain: warning:") and "Training goes on" in said[0], said
    assert said[1].endswith("was written after 1 write refused: checkpoints are saved again."), said


# -- the copies of what an optimizer step changes, made while the next step runs -------------

class WideTable(ptrain.TrainModule):
    """A table of ``mb`` MB (an embedding with sparse gradients, of which each step reads and
    changes 8 rows) and plain SGD: the copy of its weights takes the writer's thread longer than
    the next step takes to reach its optimizer step. ``manual``: automatic_optimization off, the
    step taken in training_step. ``max_norm``: each forward renorms the rows it reads, in
    place."""

    def __init__(self, manual: bool = False, mb: int = 128, max_norm: float | None = None):
        super().__init__()
        self.automatic_optimization = not manual
        rows = mb * 2**20 // (64 * 4)
        self.table = torch.nn.Embedding(rows, 64, sparse=True, max_norm=max_norm)
        self.head = torch.nn.Linear(64, 1)
        made = torch.Generator().manual_seed(0)
        self.data = torch.utils.data.TensorDataset(
            torch.randint(0, rows, (32,), generator=made), torch.randn(32, 1, generator=made))

    def training_step(self, batch, batch_idx):
        rows, y = batch
        loss = torch.nn.functional.mse_loss(self.head(self.table(rows)), y)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=8)


def zero_through_data(module: torch.nn.Module) -> None:
    """Set the weights to zero through ``.data`` (which no version counter sees), as a callback
    that swaps in averaged weights does; the last first (the writer's thread copies them in
    order)."""
    for parameter in reversed(list(module.parameters())):
        parameter.data.zero_()


class ZeroedAfterFit:
    """:func:`zero_through_data` once fit's training loop ends."""

    name = "zeroed-after-fit"

    @ptrain.hookimpl
    def on_loop_end(self, trainer, loop):
        if loop == "train":
            zero_through_data(trainer.module)


def fit_saving(root: Path, module: ptrain.TrainModule, every: int, *plugins,
               accelerator: str = "cpu", async_save: bool, steps: int = 4,
               **options) -> Path:
    """The checkpoint folder of a run of ``steps`` steps (one epoch, unless ``options``, the
    trainer's, say otherwise) saving every ``every`` steps (0: at the epoch's end only), each
    file kept under its step's name."""
    torch.manual_seed(0)
    trainer = ptrain.Trainer(
        accelerator=accelerator, seed=0, default_root_dir=str(root),
        callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary", *plugins],
        plugin_options={"checkpoint": {"every_n_train_steps": every, "save_top_k": -1,
                                       "filename": "{step}", "async_save": async_save}},
        **{"max_epochs": 1, **options})
    trainer.fit(deepcopy(module))
    assert trainer.global_step == steps
    return Path(trainer.plugins["checkpoint"].dirpath)


def assert_same_files(folders: list[Path], names: list[str]) -> None:
    for name in names:
        written = [safe_load(folder / name) for folder in folders]
        assert_same_tensors(written[0]["model"], written[1]["model"], f"{name}: model")
        assert_same_tensors(written[0]["optimizers"], written[1]["optimizers"], name)


def fit_both_ways(root: Path, module: ptrain.TrainModule, every: int, *plugins,
                  accelerator: str = "cpu", steps: int = 4, **options) -> list[Path]:
    """The checkpoint folders of two runs of :func:`fit_saving`: synchronously, then in the
    background; each file the same in both."""
    folders = [fit_saving(root / mode, module, every, *plugins, accelerator=accelerator,
                          async_save=mode == "async", steps=steps, **options)
               for mode in ("sync", "async")]
    names = [sorted(p.name for p in folder.glob("*.ckpt")) for folder in folders]
    assert names[0] == names[1], names
    assert len(names[0]) == (steps // every if every else 1) + 1, names  # and last.ckpt
    assert_same_files(folders, names[0])
    return folders


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_every_file_written_in_the_background_holds_its_own_steps_state(tmp_path, manual):
    """A save at every step: the copies of the weights are made on the writer's thread while
    the next step runs, and the next optimizer step (the loop's, or the module's own) waits for
    them."""
    fit_both_ways(tmp_path, WideTable(manual=manual), 1)


def test_what_changes_the_weights_after_the_last_save_waits_for_its_copies(tmp_path):
    """The save at the last step is still copying when the training loop ends, and what runs
    from there on (a callback that swaps in averaged weights) may change the weights."""
    folders = fit_both_ways(tmp_path, WideTable(mb=512), 4, ZeroedAfterFit())
    assert safe_load(folders[1] / "step=4.ckpt")["model"]["head.weight"].abs().sum() > 0


def test_a_save_anywhere_but_between_two_steps_is_copied_before_what_follows_it(tmp_path):
    """The save at the epoch's end is followed by the end of the training loop, where a
    callback may change the weights through .data (which no version counter sees): only a
    save between two training steps leaves its copies to the writer's thread."""
    folders = fit_both_ways(tmp_path, WideTable(mb=512), 0, ZeroedAfterFit())
    assert safe_load(folders[1] / "step=4.ckpt")["model"]["head.weight"].abs().sum() > 0


class ValidatedTable(WideTable):
    def validation_step(self, batch, batch_idx):
        rows, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.head(self.table(rows)), y))

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=16)


class ZeroedAtValidation:
    """:func:`zero_through_data` at the start of each validation (after the sanity check)."""

    name = "zeroed-at-validation"

    @ptrain.hookimpl
    def on_loop_start(self, trainer, loop):
        if loop == "validate" and not trainer.sanity_checking:
            zero_through_data(trainer.module)


class ClampedAfterTheCheckpoint:
    """Clamps the weights through ``.data`` (which no version counter sees) in its
    on_train_batch_end, which runs after the checkpoint callback's (WGAN-style clipping), and
    keeps what the next batch starts from."""

    name = "clamped-after-the-checkpoint"

    def __init__(self):
        self.starts: dict[int, dict[str, torch.Tensor]] = {}

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer):
        for parameter in trainer.module.parameters():
            parameter.data.clamp_(-0.01, 0.01)
        self.starts[trainer.global_step] = {
            name: tensor.clone() for name, tensor in trainer.module.state_dict().items()}


def test_a_later_callbacks_change_through_data_is_never_half_in_a_background_file(tmp_path):
    """The copies made while the next step runs start once every on_train_batch_end
    implementation has run: the file holds the weights the next step starts from, whole, not
    some tensors (or part of one) before the change and the rest after it."""
    clamped = ClampedAfterTheCheckpoint()
    folder = fit_saving(tmp_path, WideTable(mb=256), 1, clamped, async_save=True)
    for step in range(1, 5):
        written = safe_load(folder / f"step={step}.ckpt")["model"]
        assert_same_tensors(written, clamped.starts[step], f"step={step}.ckpt")


def test_a_validation_in_the_middle_of_an_accumulation_window_waits_for_the_copies(tmp_path):
    """The save at step 1 (batch 2) is still copying when batch 3, which takes no optimizer
    step, runs a validation: the copies are waited for after that batch's backward."""
    folders = fit_both_ways(tmp_path, ValidatedTable(mb=512), 1, ZeroedAtValidation(),
                            steps=2, accumulate_grad_batches=2, val_check_interval=3,
                            num_sanity_val_steps=0)
    assert safe_load(folders[1] / "step=1.ckpt")["model"]["head.weight"].abs().sum() > 0


def test_a_forward_that_renorms_the_weights_costs_a_checkpoint_one_step_and_not_the_run(
        tmp_path, capfd):
    """nn.Embedding(max_norm=...) renorms, in place, the rows the next step's forward reads,
    before the writer's thread has copied the table: the save at step 2 is said lost and taken
    again at step 3, and the run's later saves copy everything first. Should the writer's thread
    copy the table before that forward (a scheduling chance), nothing is lost and the files are
    those of synchronous saves."""
    module = WideTable(mb=512, max_norm=1.0)
    sync = fit_saving(tmp_path / "sync", module, 2, async_save=False)
    capfd.readouterr()
    background = fit_saving(tmp_path / "async", module, 2, async_save=True)
    said = capfd.readouterr().err
    names = [sorted(p.name for p in folder.glob("*.ckpt")) for folder in (sync, background)]
    assert names[0] == ["last.ckpt", "step=2.ckpt", "step=4.ckpt"], names
    if "was changed in place" not in said:
        assert names[1] == names[0], said
        assert_same_files([sync, background], names[0])
        return
    assert said.count("was changed in place") == 1, said
    assert "checkpoint of step 2 was not written" in said and "'table.weight'" in said
    assert "max_norm" in said and "taken again at the next step" in said
    assert names[1] == ["last.ckpt", "step=3.ckpt", "step=4.ckpt"], (names, said)
    assert safe_load(background / "step=3.ckpt")["loop"]["global_step"] == 3
    assert_same_files([sync, background], ["last.ckpt", "step=4.ckpt"])


class SavesEachStepItself:
    """Saves ``own-<step>.ckpt`` in the background itself at each step, waiting on none."""

    name = "saves-each-step-itself"

    def __init__(self, root: Path):
        self.root = root

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        trainer.save_checkpoint(self.root / f"own-{trainer.global_step}.ckpt",
                                asynchronous=True)


def test_a_users_own_save_lost_to_a_renorming_forward_is_said_and_the_run_goes_on(tmp_path,
                                                                                  capfd):
    """Unlike a refused write, a tensor changed before its deferred copy is the background
    copy's own limit, which a synchronous save never meets: said, not raised."""
    trainer = trainer_of(tmp_path, SavesEachStepItself(tmp_path), max_epochs=1)
    trainer.fit(WideTable(mb=64, max_norm=1.0))
    said = [line for line in capfd.readouterr().err.splitlines()
            if "was not written" in line and "Training goes on" in line]
    written = sorted(p.name for p in tmp_path.glob("own-*.ckpt"))
    assert trainer.global_step == 4 and said and "own-4.ckpt" in written
    assert len(written) == 4 - len(said)


class ChangedInPlaceAtTheEnd:
    """After the checkpoint callback's on_train_batch_end of the last step (trylast), changes
    the table in place (by a factor of 1: the values stay), as a weight constraint applied
    there would: the save of that step is found lost only at the end of the training loop."""

    name = "changed-in-place-at-the-end"

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer, batch, batch_idx, loss):
        if trainer.global_step == 4:
            with torch.no_grad():
                trainer.module.table.weight.mul_(1.0)


def test_a_save_lost_at_the_last_step_is_taken_again_at_the_end_of_the_loop(tmp_path, capfd):
    """No step follows the lost save: the end of the training loop takes it again, at the same
    step, top-k file and last.ckpt alike (nothing of the lost save counts as written). Should
    the writer's thread copy the table before the change (a scheduling chance), nothing is lost
    either."""
    module = WideTable(mb=512)
    sync = fit_saving(tmp_path / "sync", module, 4, async_save=False)
    capfd.readouterr()
    background = fit_saving(tmp_path / "async", module, 4, ChangedInPlaceAtTheEnd(),
                            async_save=True)
    said = capfd.readouterr().err
    assert "was changed in place" not in said or "checkpoint of step 4 was not written" in said
    names = [sorted(p.name for p in folder.glob("*.ckpt")) for folder in (sync, background)]
    assert names[0] == names[1] == ["last.ckpt", "step=4.ckpt"], (names, said)
    assert_same_files([sync, background], names[0])


class ChangedInPlaceAt:
    """After the checkpoint callback's on_train_batch_end of step ``step`` (trylast), changes
    the table in place (by a factor of 1: the values stay): the save of that step is lost."""

    name = "changed-in-place-at"

    def __init__(self, step: int):
        self.step = step

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer, batch, batch_idx, loss):
        if trainer.global_step == self.step:
            with torch.no_grad():
                trainer.module.table.weight.mul_(1.0)


class ScoredTable(WideTable):
    """Logs ``score`` = ``SCORES[step]`` at each step (the step its optimizer step makes)."""

    SCORES = {1: 9.0, 2: 1.0, 3: 9.0, 4: 3.0, 5: 9.0, 6: 0.5, 7: 2.0, 8: 5.0, 9: 0.1,
              10: 5.0, 11: 5.0, 12: 5.0}

    def training_step(self, batch, batch_idx):
        self.log("score", self.SCORES[self.trainer.global_step + 1])
        return super().training_step(batch, batch_idx)


def test_a_lost_save_is_taken_again_once_and_the_triggers_go_on_as_before(tmp_path, capfd):
    """The top-1 save at step 6 (score 0.5) is lost: the top-k goes back to step 2's file,
    step 7 takes it again and ranks its own score (2.0, not kept), and from there only the
    triggers' steps rank (8, 10, 12), not step 9, whose 0.1 would have been kept. Should the
    writer's thread copy the table before the change (a scheduling chance), nothing is lost
    and step 6's file is kept."""
    torch.manual_seed(0)
    trainer = ptrain.Trainer(
        accelerator="cpu", seed=0, default_root_dir=str(tmp_path), max_epochs=3,
        callbacks=["no:progress-bar", "no:tensorboard", "no:model-summary",
                   ChangedInPlaceAt(6)],
        plugin_options={"checkpoint": {
            "every_n_train_steps": 2, "save_top_k": 1, "monitor": "score", "mode": "min",
            "save_last": False, "filename": "{step}", "async_save": True}})
    trainer.fit(ScoredTable(mb=256))
    said = capfd.readouterr().err
    folder = Path(trainer.plugins["checkpoint"].dirpath)
    names = sorted(p.name for p in folder.glob("*.ckpt"))
    if "was changed in place" not in said:
        assert names == ["step=6.ckpt"], said
        return
    assert "checkpoint of step 6 was not written" in said
    assert names == ["step=2.ckpt"], (names, said)
