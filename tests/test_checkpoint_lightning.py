"""``ptrain.lightning.callbacks.ModelCheckpoint`` against Lightning 2.6.6 running the same
program: the files each writes and their names (``save_last`` True and ``"link"``,
``enable_version_counter=False``, the default callback and its folder, ``save_on_exception``),
the keys of the checkpoint files a Lightning program reads, the callback's attributes and
state, ``verbose`` lines, and Lightning's class attributes and methods (``state_key``,
``format_checkpoint_name``, ``to_yaml``, ``CHECKPOINT_NAME_LAST``, ``FILE_EXTENSION``)."""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import os
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from ptrain.errors import CheckpointError
from tests._lightning_pair import FRAMEWORKS, QUIET, Numbers


def model_class(pl, fail_at: tuple[int, int] | None = None):
    """A small regression module against ``pl`` that logs ``val_loss`` and ``score`` (a value
    scripted per epoch, so the top-k is known); it raises ``RuntimeError("Trouble")`` in
    ``on_train_batch_end`` at ``fail_at`` (epoch, batch)."""

    class Model(pl.LightningModule):
        scores = [3.0, 1.0, 2.0, 0.5]

        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).pow(2).mean()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if fail_at == (self.current_epoch, batch_idx):
                raise RuntimeError("Trouble")

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.layer(batch).pow(2).mean())

        def on_validation_epoch_end(self):
            self.log("score", self.scores[self.current_epoch % len(self.scores)])

        def train_dataloader(self):
            return DataLoader(Numbers(8), batch_size=4)

        def val_dataloader(self):
            return DataLoader(Numbers(4, seed=1), batch_size=4)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model


def both(run):
    """``run(pl, folder)`` under Lightning and ptrain.lightning; their results."""
    results = []
    for name in FRAMEWORKS:
        pl = importlib.import_module(name)
        pl.seed_everything(0)
        results.append(run(pl, name.split(".")[0]))
    return results


def listing(folder: Path) -> dict[str, str]:
    """Each entry of ``folder``: ``link->TARGET``, ``dir`` or ``file``."""
    return {p.name: (f"link->{os.readlink(p)}" if p.is_symlink() else
                     "dir" if p.is_dir() else "file") for p in sorted(folder.iterdir())}


def fit(pl, root: Path, callbacks, max_epochs: int = 4, fail_at=None, **options):
    trainer = pl.Trainer(default_root_dir=root, max_epochs=max_epochs, logger=False,
                         callbacks=callbacks, **{**QUIET, **options})
    trainer.fit(model_class(pl, fail_at)())
    return trainer


# -- files and names ----------------------------------------------------------------------------


@pytest.mark.parametrize("save_last", [True, "link", None])
def test_top_k_files_last_and_attributes_match_lightning(tmp_path, save_last):
    def run(pl, name):
        folder = tmp_path / name / "ckpts"
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=2,
                                                filename="{epoch}-{score:.1f}",
                                                save_last=save_last)
        fit(pl, tmp_path / name, [callback])
        return (listing(tmp_path / name), listing(folder),
                Path(callback.best_model_path).name, Path(callback.kth_best_model_path).name,
                Path(callback.last_model_path).name,
                {Path(p).name: float(s) for p, s in callback.best_k_models.items()},
                float(callback.best_model_score), float(callback.current_score),
                type(callback.best_model_score), callback.dirpath == str(folder))

    lightning, ours = both(run)
    assert ours == lightning
    if save_last == "link":  # the link resolves to the newest top-k file
        folder = tmp_path / "ptrain" / "ckpts"
        assert os.path.realpath(folder / "last.ckpt") == str(folder / "epoch=3-score=0.5.ckpt")


def test_last_is_written_beside_a_kept_top_k_file_only_as_lightning_does(tmp_path):
    """Top 1 by score (3, 1, 2): epoch 2's value is not kept, and Lightning 2.6 then leaves
    last.ckpt at epoch 1's state, which ckpt_path="last" validates."""
    def run(pl, name):
        folder = tmp_path / name / "ckpts"
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=1,
                                                save_last=True)
        trainer = fit(pl, tmp_path / name, [callback], max_epochs=3)
        last = torch.load(folder / "last.ckpt", weights_only=False)
        validated = trainer.validate(ckpt_path="last", verbose=False)
        return (last["epoch"], last["global_step"], list(listing(folder)),
                Path(callback.last_model_path).name, validated)

    lightning, ours = both(run)
    assert lightning[:2] == (1, 4)
    assert ours == lightning


@pytest.mark.parametrize("logger", [False, True])
def test_a_top_k_file_named_last_is_last_ckpt_as_lightnings(tmp_path, logger):
    """yoyodyne's checkpoint config: ``filename="last"``, ``save_last=False``, a monitored top
    1 (scores 3, 1, 2, 0.5 under mode max: epoch 0's file is kept), then ``ckpt_path`` names
    ``.../checkpoints/last.ckpt``. Lightning's top-k file takes the free name ``last.ckpt``;
    ptrain's was ``last-v1.ckpt``."""
    def run(pl, name):
        callback = pl.callbacks.ModelCheckpoint(filename="last", monitor="score", mode="max",
                                                save_last=False)
        trainer = pl.Trainer(default_root_dir=tmp_path / name, max_epochs=4, logger=logger,
                             callbacks=[callback], **QUIET)
        trainer.fit(model_class(pl)())
        folder = Path(callback.dirpath)
        return (os.path.relpath(folder, tmp_path / name), sorted(os.listdir(folder)),
                Path(callback.best_model_path).name, torch.load(
                    folder / "last.ckpt", weights_only=False)["epoch"],
                trainer.validate(ckpt_path=str(folder / "last.ckpt"), verbose=False))

    lightning, ours = both(run)
    assert lightning[2:4] == ("last.ckpt", 0)
    assert ours[0] == lightning[0]
    # on purpose: ptrain keeps its top-k record beside the files in the run folder
    assert [f for f in ours[1] if f != "best_k_models.json"] == lightning[1]
    assert ours[2:] == lightning[2:]


def test_the_default_callback_and_its_folder_match_lightnings(tmp_path):
    def run(pl, name):
        root = tmp_path / name
        trainer = pl.Trainer(default_root_dir=root, max_epochs=2, **QUIET)  # a logger
        trainer.fit(model_class(pl)())
        quiet = pl.Trainer(default_root_dir=root / "quiet", max_epochs=2, logger=False, **QUIET)
        quiet.fit(model_class(pl)())
        callback = quiet.checkpoint_callback
        return (type(trainer.checkpoint_callback).__name__,
                os.path.relpath(trainer.checkpoint_callback.dirpath, root),
                sorted(os.listdir(trainer.checkpoint_callback.dirpath)),
                listing(root / "quiet"), sorted(os.listdir(callback.dirpath)),
                os.path.relpath(callback.best_model_path, root))

    lightning, ours = both(run)
    assert ours == lightning


def test_logger_false_leaves_no_log_folder_for_saved_hyperparameters_as_lightning(tmp_path):
    # Lightning's hparams.yaml is a logger's file: without loggers, every stage of a module
    # that saves its hyperparameters leaves only the checkpoints
    def run(pl, name):
        class Saving(model_class(pl)):
            def __init__(self, width: int = 4):
                super().__init__()
                self.save_hyperparameters()

            def forward(self, batch):
                return self.layer(batch)

        root = tmp_path / name
        trainer = pl.Trainer(default_root_dir=root, max_epochs=1, logger=False, **QUIET)
        trainer.fit(Saving())
        trainer.validate(Saving(), verbose=False)
        trainer.predict(Saving(), DataLoader(Numbers(4), batch_size=4))
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    lightning, ours = both(run)
    assert ours == lightning


def test_enable_version_counter_false_replaces_the_files_as_lightnings_does(tmp_path):
    def run(pl, name):
        folder = tmp_path / name
        for _ in range(2):
            callback = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="epoch", mode="max",
                                                    save_top_k=-1, save_last=True,
                                                    filename="{epoch}",
                                                    enable_version_counter=False)
            fit(pl, folder, [callback], max_epochs=2)
        return listing(folder), sorted(Path(p).name for p in callback.best_k_models)

    with pytest.warns(UserWarning, match="enable_version_counter=False.*replaced"):
        lightning, ours = both(run)
    assert ours == lightning


def test_the_version_counter_gives_a_second_run_new_names_as_lightnings_does(tmp_path):
    def run(pl, name):
        folder = tmp_path / name
        for _ in range(2):
            callback = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="epoch", mode="max",
                                                    save_top_k=-1, save_last=True,
                                                    filename="{epoch}")
            fit(pl, folder, [callback], max_epochs=2)
        return (listing(folder), sorted(Path(p).name for p in callback.best_k_models),
                Path(callback.last_model_path).name)

    lightning, ours = both(run)
    assert ours == lightning


def test_a_second_run_into_the_folder_is_warned_from_the_callback_as_lightning_warns(tmp_path):
    """Lightning says a second run's folder is not empty; ours says what the names will be, from
    the callback's own file (a warning from a hook otherwise points into pluggy)."""
    def run(pl, name):
        folder = tmp_path / name
        fit(pl, folder, [pl.callbacks.ModelCheckpoint(dirpath=folder)], max_epochs=1)
        with pytest.warns(UserWarning) as said:
            fit(pl, folder, [pl.callbacks.ModelCheckpoint(dirpath=folder)], max_epochs=1)
        return [(Path(w.filename).name, str(w.message)) for w in said
                if str(folder) in str(w.message)]

    (lightning,), (ours,) = both(run)
    assert lightning[1] == f"Checkpoint directory {tmp_path / 'lightning'} exists and is not empty."
    assert ours == ("model_checkpoint.py", f"the checkpoint folder {tmp_path / 'ptrain'} already "
                    f"holds files; a name of this run's that is taken there gets -v1, -v2...")


def test_save_on_exception_writes_the_files_lightning_writes(tmp_path):
    def run(pl, name):
        folder = tmp_path / name
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, filename="exception",
                                                save_on_exception=True, every_n_epochs=7)
        with pytest.raises(RuntimeError, match="Trouble"):
            fit(pl, folder, [callback], fail_at=(1, 0))
        saved = torch.load(folder / "exception.ckpt", weights_only=True)
        return (listing(folder), saved["global_step"], sorted(saved["state_dict"]),
                callback.best_model_path, callback.best_k_models)

    with pytest.warns(UserWarning, match="RuntimeError: Trouble.*saved to .*exception.ckpt"):
        lightning, ours = both(run)
    assert ours == lightning


def test_a_file_is_written_only_when_a_step_was_trained_since_the_last(tmp_path):
    def run(pl, name):
        folder = tmp_path / name
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, filename="{step}",
                                                save_on_exception=True, every_n_train_steps=1)
        with pytest.raises(RuntimeError, match="Trouble"):
            fit(pl, folder, [callback], fail_at=(0, 1))
        return listing(folder)

    lightning, ours = both(run)
    # Lightning: the error came after step 2 was saved: no exception file (save_top_k=1 keeps
    # the newest)
    assert lightning == {"step=2.ckpt": "file"}
    # ptrain: the module's on_train_batch_end runs where Lightning runs it, before the
    # validation, and ptrain's files are written after the validation (so they resume exactly):
    # the error came before step 2's file, which save_on_exception wrote instead, beside step 1's
    assert ours == {"step=1.ckpt": "file", "step=2.ckpt": "file"}


# -- what the files hold --------------------------------------------------------------------------


def test_checkpoint_files_carry_lightnings_keys_without_storing_the_weights_twice(tmp_path):
    def run(pl, name):
        folder = tmp_path / name
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="score", save_last=True,
                                                filename="best")
        trainer = fit(pl, folder, [callback], max_epochs=2)
        trainer.save_checkpoint(folder / "weights.ckpt", weights_only=True)
        full = torch.load(folder / "last.ckpt", weights_only=True)
        weights = torch.load(folder / "weights.ckpt", weights_only=True)
        state = dict(full["callbacks"][callback.state_key])
        # ptrain's one key more: the files due for deletion (none here; tests/
        # test_checkpoint_kill.py), which Lightning's load_state_dict ignores (below)
        assert state.pop("due_for_deletion", {}) == {}
        return (full["epoch"], full["global_step"], sorted(full["state_dict"]),
                len(full["optimizer_states"]), len(full["lr_schedulers"]),
                {k: (v == str(folder) if k == "dirpath" else Path(v).name if isinstance(v, str)
                     else float(v) if k.endswith("score") else None) for k, v in state.items()},
                weights["epoch"], weights["global_step"], sorted(weights["state_dict"]),
                "optimizer_states" in weights, "pytorch-lightning_version" in full)

    lightning, ours = both(run)
    assert ours == lightning
    full = torch.load(tmp_path / "ptrain" / "last.ckpt", weights_only=True)
    assert full["state_dict"] is full["model"]  # one object, written once
    import lightning.pytorch as pl

    (state,) = full["callbacks"].values()
    assert "due_for_deletion" in state
    reader = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ptrain", monitor="score")
    reader.load_state_dict(state)  # Lightning's own, with ptrain's key
    assert Path(reader.best_model_path) == tmp_path / "ptrain" / "best.ckpt"
    assert Path(reader.last_model_path) == tmp_path / "ptrain" / "last.ckpt"
    # about the bytes of one copy of the weights: aliases cost a name each
    one_copy = torch.load(tmp_path / "ptrain" / "last.ckpt", weights_only=True)
    del one_copy["state_dict"], one_copy["optimizer_states"], one_copy["callbacks"]
    torch.save(one_copy, tmp_path / "one_copy.pt")
    grown = os.path.getsize(tmp_path / "ptrain" / "last.ckpt") - os.path.getsize(
        tmp_path / "one_copy.pt")
    assert grown < 1024


@pytest.mark.parametrize("when", ["each_step", "train_epoch_end"])
def test_a_checkpoint_holds_early_stoppings_state_after_its_check_as_lightnings(tmp_path, when):
    """The checkpoint written at a validation (or at an epoch's end) is taken after early
    stopping counted that check, as Lightning runs its checkpoint callbacks last; before, it
    was taken first, so a resume from it counted one check fewer without improvement."""
    def run(pl, name):
        folder = tmp_path / name
        stopping = pl.callbacks.EarlyStopping(
            "score", patience=10, check_on_train_epoch_end=True if when == "train_epoch_end"
            else None)
        checkpoint = pl.callbacks.ModelCheckpoint(dirpath=folder, save_top_k=-1)
        options = dict(val_check_interval=1, check_val_every_n_epoch=None) \
            if when == "each_step" else {}
        fit(pl, folder, [stopping, checkpoint], **options)
        counts = {}
        for file in sorted(folder.glob("*.ckpt")):
            saved = torch.load(file, weights_only=True)
            if name == "lightning":
                (state,) = (v for k, v in saved["callbacks"].items()
                            if k.startswith("EarlyStopping"))
                counts[file.name] = state["wait_count"]
            else:
                counts[file.name] = saved["plugins"]["early-stopping"]["wait"]
        return counts, stopping.wait_count

    lightning, ours = both(run)
    assert ours == lightning
    assert len(set(ours[0].values())) > 1  # the count moves from file to file


def test_resuming_from_a_linked_last_checkpoint_goes_on_as_lightning(tmp_path):
    def run(pl, name):
        folder = tmp_path / name
        callback = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=1,
                                                save_last="link")
        fit(pl, folder, [callback], max_epochs=2)
        resumed = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="score", save_top_k=1,
                                               save_last="link")
        trainer = pl.Trainer(default_root_dir=folder, max_epochs=4, logger=False,
                             callbacks=[resumed], **QUIET)
        model = model_class(pl)()
        trainer.fit(model, ckpt_path=str(folder / "last.ckpt"))
        return (trainer.global_step, listing(folder), Path(resumed.best_model_path).name,
                [round(float(p), 4) for p in model.parameters() for p in p.flatten()])

    lightning, ours = both(run)
    assert ours[:3] == lightning[:3]
    assert ours[3] == pytest.approx(lightning[3], abs=1e-5)


def test_a_programs_checkpoint_io_decides_what_its_checkpoints_may_hold(tmp_path):
    # darts keeps its loss module in on_save_checkpoint and reads its checkpoints through a
    # TorchCheckpointIO that widens torch's weights-only loader to the classes it trusts
    def run(pl, name):
        class KeepsLoss(model_class(pl)):
            def on_save_checkpoint(self, checkpoint):
                checkpoint["loss_fn"] = torch.nn.MSELoss()

            def on_load_checkpoint(self, checkpoint):
                self.restored = checkpoint["loss_fn"]

        class TrustsLosses(pl.plugins.TorchCheckpointIO):
            def load_checkpoint(self, path, map_location=None, weights_only=None):
                with torch.serialization.safe_globals([torch.nn.MSELoss]):
                    return super().load_checkpoint(path, map_location, weights_only=True)

        folder = tmp_path / name
        options = dict(default_root_dir=folder, logger=False, plugins=[TrustsLosses()], **QUIET)
        pl.Trainer(max_epochs=1, **options).fit(KeepsLoss())
        model = KeepsLoss()
        trainer = pl.Trainer(max_epochs=2, **options)
        trainer.fit(model, ckpt_path=str(folder / "checkpoints" / "epoch=0-step=2.ckpt"))
        return (type(model.restored).__name__, trainer.global_step,
                [round(float(p), 5) for p in model.parameters() for p in p.flatten()])

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[:2] == ("MSELoss", 4)


def test_load_from_checkpoint_calls_on_load_checkpoint_with_what_was_saved(tmp_path):
    # darts rebuilds its models with load_from_checkpoint; its on_load_checkpoint reads the
    # keys its on_save_checkpoint added (it was a TypeError before the weights loaded)
    def run(pl, name):
        class Keeps(model_class(pl)):
            def on_save_checkpoint(self, checkpoint):
                checkpoint["note"] = {"dtype": str(self.dtype), "epoch": self.current_epoch}

            def on_load_checkpoint(self, checkpoint):
                self.note = (checkpoint["note"], checkpoint["epoch"], checkpoint["global_step"],
                             sorted(checkpoint["state_dict"]))

        trainer = pl.Trainer(default_root_dir=tmp_path / name, max_epochs=1, logger=False,
                             **QUIET)
        trainer.fit(Keeps())
        loaded = Keeps.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
        return loaded.note, [round(float(p), 6) for p in loaded.parameters() for p in p.flatten()]

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[0][0] == {"dtype": "torch.float32", "epoch": 0}


def test_hparams_name_naming_init_kwargs_loads_them_as_keywords_as_lightning(tmp_path):
    # pytorch-forecasting's on_save_checkpoint sets checkpoint["hparams_name"] = "kwargs", the
    # name of its models' **kwargs: Lightning passes the hyperparameters as keywords (they
    # were passed as `kwargs={...}`, a TypeError in its __init__)
    def run(pl, name):
        class Named(model_class(pl)):
            def __init__(self, width: int = 1, **kwargs):
                super().__init__()
                self.save_hyperparameters()
                self.extra = kwargs

            def on_save_checkpoint(self, checkpoint):
                checkpoint["hparams_name"] = "kwargs"

        trainer = pl.Trainer(default_root_dir=tmp_path / name, max_epochs=1, logger=False,
                             **QUIET)
        trainer.fit(Named(width=3, depth=2))
        loaded = Named.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
        return dict(loaded.hparams), loaded.extra

    lightning, ours = both(run)
    assert ours == lightning == ({"width": 3, "depth": 2}, {"depth": 2})


class Outputs:
    """An init argument of a class torch's weights-only loader does not know: ptrain leaves it
    out of checkpoints (Lightning pickles it)."""

    def __init__(self, n: int):
        self.n = n


def test_a_mismatch_on_load_names_the_arguments_the_checkpoint_holds_no_value_for(tmp_path):
    # neuralforecast's models take their loss as an object (MQLoss(level=[80])) that sizes the
    # output layer: Lightning's load_from_checkpoint(weights_only=False) rebuilds it, ptrain's
    # checkpoint does not hold it, so the model is built with the default and the weights do
    # not fit; the error says which argument to pass again
    def run(pl, name):
        class Sized(model_class(pl)):
            def __init__(self, outputs: Outputs = Outputs(1), lr: float = 0.1):
                super().__init__()
                self.save_hyperparameters()
                self.layer = torch.nn.Linear(4, outputs.n)

        trainer = pl.Trainer(default_root_dir=tmp_path / name, max_epochs=1, logger=False,
                             **QUIET)
        trainer.fit(Sized(Outputs(3), lr=0.2))
        path = trainer.checkpoint_callback.best_model_path
        try:
            Sized.load_from_checkpoint(path, weights_only=False)
        except RuntimeError as error:
            refused = str(error)
        else:
            refused = None
        loaded = Sized.load_from_checkpoint(path, weights_only=False, outputs=Outputs(3))
        return refused, loaded.hparams["lr"], loaded.layer.weight.tolist()

    lightning, ours = both(run)
    assert lightning[0] is None
    assert ours[1:] == lightning[1:]
    assert "size mismatch" in ours[0] and "outputs" in ours[0].split("size mismatch")[-1]
    assert "lr" not in ours[0].split("size mismatch")[-1]


def test_the_trainers_strategy_reads_a_checkpoint_as_lightnings_does(tmp_path):
    # pytorch-forecasting's Tuner replaces trainer.strategy.load_checkpoint (to pass
    # weights_only=False) around lr_find: reading the attribute was an AttributeError
    def run(pl, name):
        trainer = fit(pl, tmp_path / name, callbacks=None, max_epochs=2)
        read = trainer.strategy.load_checkpoint(trainer.checkpoint_callback.best_model_path,
                                                weights_only=True)
        return (read["epoch"], read["global_step"],
                {k: v.tolist() for k, v in read["state_dict"].items()})

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[:2] == (1, 4)


def test_lr_find_hands_on_save_checkpoint_the_hyperparameters_as_lightning(tmp_path):
    # pytorch-forecasting's on_save_checkpoint updates checkpoint["hyper_parameters"]; the
    # finder's snapshot of the run (Lightning's is a checkpoint file) held none: KeyError
    def run(pl, name):
        class Seen(model_class(pl)):
            def __init__(self, lr: float = 0.1):
                super().__init__()
                self.save_hyperparameters()
                self.seen = []

            def on_save_checkpoint(self, checkpoint):
                self.seen.append(dict(checkpoint["hyper_parameters"]))
                checkpoint["hyper_parameters"]["added"] = 1

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

        trainer = pl.Trainer(default_root_dir=tmp_path / name, logger=False, max_epochs=1,
                             **QUIET)
        model = Seen()
        tuner = importlib.import_module(f"{pl.__name__}.tuner")
        tuner.Tuner(trainer).lr_find(model, num_training=5, update_attr=False)
        return model.seen, dict(model.hparams)

    lightning, ours = both(run)
    assert ours == lightning == ([{"lr": 0.1}], {"lr": 0.1})


@pytest.mark.parametrize("after, weights_only", [("fit", False), ("predict", False),
                                                  ("fit", True)])
def test_a_save_after_a_stage_holds_what_on_save_checkpoint_adds(tmp_path, after,
                                                                 weights_only):
    # darts saves a model with trainer.save_checkpoint after its fit or predict has returned,
    # with weights_only=True for save(clean=True)
    def run(pl, name):
        class Keeps(model_class(pl)):
            def on_save_checkpoint(self, checkpoint):
                checkpoint["note"] = f"saved at step {self.global_step}"

            def on_load_checkpoint(self, checkpoint):
                self.note = checkpoint["note"]

            def predict_step(self, batch, batch_idx):
                return self.layer(batch)

        trainer = pl.Trainer(default_root_dir=tmp_path / name, max_epochs=1, logger=False,
                             enable_checkpointing=False, **QUIET)
        model = Keeps()
        trainer.fit(model)
        if after == "predict":
            trainer = pl.Trainer(default_root_dir=tmp_path / name, logger=False, **QUIET)
            trainer.predict(model, DataLoader(Numbers(4), batch_size=2))
        path = tmp_path / name / "saved.ckpt"
        trainer.save_checkpoint(path, weights_only=weights_only)
        # darts' load_weights reads its keys from the file itself
        assert torch.load(path, weights_only=False)["note"] == Keeps.load_from_checkpoint(
            path).note
        return Keeps.load_from_checkpoint(path).note

    lightning, ours = both(run)
    assert ours == lightning == ("saved at step 2" if after == "fit" else "saved at step 0")


def test_a_save_after_fit_holds_the_state_of_the_callbacks_the_module_configured(tmp_path):
    # the callbacks configure_callbacks returned stay the trainer's after fit: a save then
    # holds the state they trained to, not that of fresh ones from another call
    def run(pl, name):
        class Counts(pl.Callback):
            def __init__(self):
                self.batches = 0

            def on_train_batch_end(self, *args):
                self.batches += 1

            def state_dict(self):
                return {"batches": self.batches}

            def load_state_dict(self, state):
                self.batches = state["batches"]

        made = []

        class Configures(model_class(pl)):
            def configure_callbacks(self):
                made.append(Counts())
                return made[-1:]

        trainer = pl.Trainer(default_root_dir=tmp_path / name, max_epochs=2, logger=False,
                             enable_checkpointing=False, **QUIET)
        trainer.fit(Configures())
        saved = []
        for n in range(2):
            trainer.save_checkpoint(tmp_path / name / f"saved{n}.ckpt")
            saved.append(list(torch.load(tmp_path / name / f"saved{n}.ckpt",
                                         weights_only=True)["callbacks"].values()))
        return saved, len(made)

    lightning, ours = both(run)
    assert ours == lightning == ([[{"batches": 4}]] * 2, 1)


def test_a_checkpoint_holds_a_callbacks_state_after_its_on_validation_end_as_lightnings(
        tmp_path):
    # Lightning runs its checkpoint callbacks after the others: a callback counting
    # validations saved 0, 1, 2 where Lightning's files hold 1, 2, 3 (its on_validation_end
    # ran after the save), so a resumed run counted one validation fewer
    def run(pl, name):
        class Counts(pl.Callback):
            def __init__(self):
                self.validations = 0

            def on_validation_end(self, trainer, pl_module):
                self.validations += not trainer.sanity_checking

            def state_dict(self):
                return {"validations": self.validations}

        folder = tmp_path / name / "ckpts"
        every = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="val_loss", save_top_k=-1,
                                             filename="{step}")
        # a validation after every batch: its save is the validation's, not the epoch end's
        fit(pl, tmp_path / name, [Counts(), every], max_epochs=2, val_check_interval=1,
            check_val_every_n_epoch=None)
        files = [torch.load(folder / f"step={s}.ckpt", weights_only=False) for s in range(1, 5)]
        return [next(state for key, state in file["callbacks"].items() if "Counts" in key)
                for file in files]

    lightning, ours = both(run)
    assert ours == lightning == [{"validations": n} for n in (1, 2, 3, 4)]


def test_two_callbacks_of_one_class_adding_to_the_checkpoint_run_and_resume_as_lightnings(
        tmp_path):
    # two instances of a callback class with on_save_checkpoint and no state_dict were refused
    # ("two callbacks save their state under 'Adds'"), which Lightning runs; the keys they add
    # are keys of the file, as Lightning's
    def run(pl, name):
        seen = []

        class Adds(pl.Callback):
            def __init__(self, n):
                self.n = n

            def on_save_checkpoint(self, trainer, pl_module, checkpoint):
                checkpoint[f"added-{self.n}"] = trainer.global_step

            def on_load_checkpoint(self, trainer, pl_module, checkpoint):
                seen.append((self.n, {k: v for k, v in checkpoint.items()
                                      if k.startswith("added-")}))

        folder = tmp_path / name
        for epochs, ckpt_path in ((1, None), (2, "last")):
            callbacks = [Adds(1), Adds(2), pl.callbacks.ModelCheckpoint(save_last=True)]
            trainer = pl.Trainer(default_root_dir=folder, max_epochs=epochs, logger=False,
                                 callbacks=callbacks, **QUIET)
            trainer.fit(model_class(pl)(), ckpt_path=ckpt_path)
        in_file = torch.load(trainer.checkpoint_callback.last_model_path, weights_only=False)
        return seen, {k: v for k, v in in_file.items() if k.startswith("added-")}

    lightning, ours = both(run)
    assert ours == lightning == ([(1, {"added-1": 2, "added-2": 2}),
                                  (2, {"added-1": 2, "added-2": 2})],
                                 {"added-1": 4, "added-2": 4})


def test_a_monitor_never_logged_in_a_fit_without_validation_is_said_as_lightning_says_it(
        tmp_path):
    # darts' best-checkpoint callback monitors val_loss also when fitted without validation
    def run(pl, name):
        folder = tmp_path / name
        best = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="val_loss")
        with pytest.warns(UserWarning, match="val_loss"):
            trainer = fit(pl, folder, [best], max_epochs=2, limit_val_batches=0)
        return trainer.global_step, best.best_model_path, sorted(
            p.name for p in folder.rglob("*.ckpt"))

    lightning, ours = both(run)
    assert ours == lightning == (4, "", [])
    from ptrain.builtins.checkpoint import ModelCheckpoint as Builtin

    assert Builtin.stops_on_unlogged_monitor_without_validation  # ptrain's own still stops


# -- Lightning's class attributes and methods -----------------------------------------------------


def test_state_key_names_and_yaml_match_lightnings(tmp_path):
    def run(pl, name):
        made = pl.callbacks.ModelCheckpoint
        keys = [made(monitor="val_loss").state_key,
                made(every_n_train_steps=3).state_key]
        checkpoint = made(dirpath=tmp_path / name, filename="{epoch:03d}-{val/acc:.2f}")
        names = [os.path.basename(checkpoint.format_checkpoint_name(
                     {"epoch": 2, "val/acc": torch.tensor(0.256)})),
                 os.path.basename(checkpoint.format_checkpoint_name(
                     {"epoch": 2, "val/acc": 0.5}, ver=2, prefix="run")),
                 made(filename="{step}").format_checkpoint_name({"step": 7})]
        subclass = type("Renamed", (made,), {"FILE_EXTENSION": ".pt",
                                             "CHECKPOINT_NAME_LAST": "final-{epoch}"})
        callback = subclass(dirpath=tmp_path / name / "sub", monitor="score", save_last=True,
                            save_top_k=2)
        fit(pl, tmp_path / name, [callback], max_epochs=3)
        callback.to_yaml(tmp_path / name / "best.yaml")
        table = yaml.safe_load((tmp_path / name / "best.yaml").read_text())
        return (keys, names, listing(tmp_path / name / "sub"),
                {Path(k).name: round(v, 4) for k, v in table.items()})

    lightning, ours = both(run)
    assert ours == lightning


def test_save_last_annotation_parses_link_with_jsonargparse():
    from jsonargparse import ArgumentParser

    from ptrain.lightning.callbacks import ModelCheckpoint

    annotation = inspect.signature(ModelCheckpoint).parameters["save_last"].annotation
    parser = ArgumentParser()
    parser.add_argument("--a", type=annotation)
    assert parser.parse_args(["--a", "link"]).a == "link"
    assert parser.parse_args(["--a", "false"]).a is False


def test_verbose_says_each_top_k_decision_as_lightning_does(tmp_path, capsys, caplog):
    def run(pl, name):
        callback = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / name, monitor="score",
                                                save_top_k=1, verbose=True)
        with caplog.at_level(logging.INFO):
            fit(pl, tmp_path / name, [callback])
        said = caplog.text + capsys.readouterr().out
        caplog.clear()
        return [line for line in said.splitlines() if "'score'" in line or "score =" in line]

    lightning, ours = both(run)
    assert len(ours) == len(lightning) == 4
    # epochs 0, 1, 3 enter the top 1; epoch 2 (2.0) does not
    assert ["not among" in line for line in ours] == [False, False, True, False]


def test_a_filename_field_never_logged_shows_0_with_a_warning(tmp_path):
    def run(pl, name):
        callback = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / name, filename="{missing}")
        fit(pl, tmp_path / name, [callback], max_epochs=1)
        return sorted(os.listdir(tmp_path / name))

    with pytest.warns(UserWarning, match="'missing', which was not logged.*missing=0"):
        lightning, ours = both(run)
    assert ours == lightning == ["missing=0.ckpt"]


def test_enable_checkpointing_false_with_a_checkpoint_callback_is_refused():
    import ptrain.lightning as pl

    with pytest.raises(ptrain_config_error(), match="enable_checkpointing=False.*ModelCheckpoint"):
        pl.Trainer(enable_checkpointing=False, callbacks=[pl.callbacks.ModelCheckpoint()])
    assert pl.Trainer(enable_checkpointing=False, **QUIET).checkpoint_callback is None


def ptrain_config_error():
    from ptrain.errors import ConfigError

    return ConfigError


def test_a_url_dirpath_is_refused():
    from ptrain.lightning.callbacks import ModelCheckpoint

    with pytest.raises(ptrain_config_error(), match="is a URL.*local or mounted folder"):
        ModelCheckpoint(dirpath="s3://bucket/checkpoints")


def test_lightning_state_dict_round_trip_and_a_changed_dirpath(tmp_path):
    from ptrain.lightning.callbacks import ModelCheckpoint

    written = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, save_last=True)
    written.best_model_path = str(tmp_path / "a.ckpt")
    written.best_k_models = {str(tmp_path / "a.ckpt"): torch.tensor(1.5)}
    written.last_model_path = str(tmp_path / "last.ckpt")
    state = written.state_dict()
    assert state["dirpath"] == str(tmp_path) and state["best_k_models"] == written.best_k_models
    same = ModelCheckpoint(dirpath=tmp_path)
    same.load_state_dict(state)
    assert same.last_model_path == written.last_model_path
    moved = ModelCheckpoint(dirpath=tmp_path / "elsewhere")
    with pytest.warns(UserWarning, match="The dirpath has changed"):
        moved.load_state_dict(state)
    assert moved.best_model_path == written.best_model_path and moved.best_k_models == {}
    assert math.isinf(float(moved.kth_value))


def _written_by_lightning(tmp_path, hyperparameter):
    """A module class against ``pl`` saving ``cfg`` and what its on_save_checkpoint adds; the
    path of the checkpoint real Lightning wrote for it, and the model Lightning loads back."""
    import lightning.pytorch as lightning

    def module_class(pl):
        class Saved(model_class(pl)):
            def __init__(self, cfg, width: int = 4):
                super().__init__()
                self.save_hyperparameters()

            def on_save_checkpoint(self, checkpoint):
                checkpoint["vocab"] = ["a", "b"]

            def on_load_checkpoint(self, checkpoint):
                self.vocab, self.seen = checkpoint["vocab"], sorted(checkpoint)

        return Saved

    lightning.seed_everything(0)
    trainer = lightning.Trainer(default_root_dir=tmp_path / "lightning", max_epochs=2,
                                logger=False, **QUIET)
    trainer.fit(module_class(lightning)(hyperparameter))
    path = trainer.checkpoint_callback.best_model_path
    return module_class, path, module_class(lightning).load_from_checkpoint(
        path, weights_only=False)


def test_a_checkpoint_lightning_wrote_loads_its_weights_as_in_lightning(tmp_path):
    # a Lightning user's trained models: they loaded nowhere ("not a ptrain checkpoint")
    import lightning.pytorch as lightning

    import ptrain.lightning as ours

    module_class, path, theirs = _written_by_lightning(tmp_path, {"a": 1})
    loaded = module_class(ours).load_from_checkpoint(path)
    assert loaded.hparams == theirs.hparams == {"cfg": {"a": 1}, "width": 4}
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 theirs.state_dict().values()))
    # on_load_checkpoint reads the whole file, as under Lightning
    assert (loaded.vocab, loaded.seen) == (theirs.vocab, theirs.seen)
    assert "loops" in loaded.seen
    options = dict(logger=False, **QUIET)
    validated = ours.Trainer(default_root_dir=tmp_path / "ours", **options).validate(
        module_class(ours)({"a": 0}), ckpt_path=path, verbose=False)
    assert validated == lightning.Trainer(default_root_dir=tmp_path / "lightning",
                                          **options).validate(theirs, verbose=False)
    with pytest.raises(CheckpointError, match="written by Lightning .*load_from_checkpoint"):
        ours.Trainer(default_root_dir=tmp_path / "ours", max_epochs=3, **options).fit(
            module_class(ours)({"a": 0}), ckpt_path=path)


def test_weights_only_false_reads_a_lightning_checkpoint_whole_as_lightning(tmp_path):
    import argparse

    import ptrain.lightning as ours

    module_class, path, theirs = _written_by_lightning(tmp_path, argparse.Namespace(x=1))
    with pytest.raises(CheckpointError, match=r"argparse.Namespace.*weights_only=False"):
        module_class(ours).load_from_checkpoint(path)
    loaded = module_class(ours).load_from_checkpoint(path, weights_only=False)
    assert loaded.hparams.cfg == theirs.hparams.cfg == argparse.Namespace(x=1)
    assert torch.equal(loaded.layer.weight, theirs.layer.weight)
