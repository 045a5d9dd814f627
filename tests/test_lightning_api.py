"""``ptrain.lightning``'s adapters, and the Lightning behaviours of the native API behind them:
the Trainer's Lightning arguments (translated or refused), module hook methods, and ``self.log``'s
arguments. The whole programs are compared against Lightning in test_lightning_dropin.py."""

from __future__ import annotations

import collections.abc
import contextlib
import types

import pytest
import torch
from torch import nn

import ptrain
import ptrain.lightning as pl
from conftest import TinyRegressor
from ptrain.lightning.callbacks import ModelCheckpoint
from ptrain.lightning.loggers import CSVLogger
from ptrain.module import NoOpLogger

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")


def test_the_namespace_is_the_native_api():
    assert pl.LightningModule is ptrain.TrainModule
    assert pl.LightningDataModule is ptrain.DataModule
    assert issubclass(pl.Trainer, ptrain.Trainer)
    assert pl.seed_everything(5) == 5


@pytest.mark.parametrize("argument, value", [
    ("plugins", ["something"]), ("enable_autolog_hparams", False),
    ("model_registry", "hub"), ("profiler", "nvtx"),
])
def test_a_lightning_argument_ptrain_cannot_honour_is_refused_by_name(argument, value):
    with pytest.raises(ptrain.ConfigError, match=f"Trainer\\({argument}=.*is not supported"):
        pl.Trainer(**{argument: value})


def test_lightning_values_take_lightnings_meaning(tmp_path):
    trainer = pl.Trainer(precision=16, logger=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), max_steps=-1, gradient_clip_val=0,
                         **QUIET)
    assert trainer.options["precision"] == "16-mixed"
    assert {"tensorboard", "checkpoint", "progress-bar", "model-summary"}.isdisjoint(
        trainer.plugins)
    assert trainer.max_steps == -1 and trainer.gradient_clip_val is None
    assert trainer.default_root_dir == str(tmp_path)  # the run folders go in lightning_logs
    assert trainer.run_root == str(tmp_path / "lightning_logs")
    assert pl.Trainer(devices=2, strategy="auto", **QUIET).options["strategy"] == "ddp"
    unused = pl.Trainer(devices=2, strategy="ddp_find_unused_parameters_true", **QUIET)
    assert unused.config["plugins"]["ddp"]["find_unused_parameters"] is True


def test_a_logger_names_the_run_folder_and_a_second_stage_logs_beside_the_first(tmp_path):
    trainer = pl.Trainer(max_epochs=1, logger=CSVLogger(tmp_path, name="exp"), **QUIET)
    module = TinyRegressor()
    trainer.fit(module)
    trainer.validate(module)
    assert trainer.log_dir == str(tmp_path / "exp" / "version_0") == trainer.logger.log_dir
    assert trainer.run_dir == tmp_path / "exp" / "version_0"
    header = (trainer.run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "train_loss" in header and "val_loss" in header
    assert not (tmp_path / "exp" / "version_1").exists()
    assert set(trainer.callback_metrics) == {"val_loss"}  # the last stage's metrics only


def test_model_checkpoint_takes_lightnings_arguments_or_refuses_them(tmp_path):
    assert ModelCheckpoint(save_on_exception=True).save_on_exception is True
    with pytest.raises(ptrain.ConfigError, match="every_n_train_steps=2, every_n_epochs=1"):
        ModelCheckpoint(every_n_train_steps=2, every_n_epochs=1)
    assert ModelCheckpoint(dirpath=tmp_path).dirpath == str(tmp_path)
    checkpoint = ModelCheckpoint(every_n_train_steps=4)
    assert checkpoint.save_last is False and checkpoint.every_n_epochs == 0


class HookedModule(TinyRegressor):
    def __init__(self):
        super().__init__()
        self.calls = []

    def setup(self, stage):
        self.calls.append(f"setup:{stage}")

    def on_train_epoch_end(self):
        self.calls.append(f"train_epoch_end:{self.current_epoch}")
        self.log("epoch_marker", float(self.current_epoch))

    def on_validation_batch_start(self, batch, batch_idx):
        self.calls.append("val_batch_start")

    def on_save_checkpoint(self, checkpoint):
        checkpoint["calls_so_far"] = len(self.calls)

    def on_load_checkpoint(self, checkpoint):
        self.calls.append(f"loaded:{checkpoint['calls_so_far']}")

    def teardown(self, stage):
        self.calls.append(f"teardown:{stage}")


def test_a_modules_hook_methods_run_at_lightnings_points(tmp_path):
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=2, limit_val_batches=1,
                             num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard"])
    module = HookedModule()
    trainer.fit(module)
    assert module.calls == ["setup:fit", "val_batch_start", "train_epoch_end:0",
                            "val_batch_start", "train_epoch_end:1", "teardown:fit"]
    # logged in an epoch-end hook: an epoch value (Lightning's default there), not a step one
    assert float(trainer.callback_metrics["epoch_marker"]) == 1.0
    resumed = HookedModule()
    ptrain.Trainer(accelerator="cpu", max_epochs=3, limit_val_batches=0,
                   default_root_dir=str(tmp_path), callbacks=["no:progress-bar",
                                                              "no:tensorboard"]).fit(
        resumed, ckpt_path="last")
    assert resumed.calls[:2] == ["setup:fit", "loaded:5"]


class OverridesUnsupported(TinyRegressor):
    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        optimizer.zero_grad()


def test_a_lightning_hook_ptrain_does_not_call_is_refused(tmp_path):
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path))
    with pytest.raises(ptrain.ModelError, match="optimizer_zero_grad is a Lightning hook "
                                                "that ptrain does not call"):
        trainer.fit(OverridesUnsupported())


@pytest.mark.parametrize("method", ["training_epoch_end", "validation_epoch_end"])
@pytest.mark.parametrize("trainer_class", [ptrain.Trainer, pl.Trainer])
def test_an_epoch_end_with_outputs_is_refused_as_lightning_refuses_it(tmp_path, method,
                                                                       trainer_class):
    module = TinyRegressor()
    setattr(module, method, lambda outputs: None)
    trainer = trainer_class(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path))
    with pytest.raises(ptrain.ModelError, match=f"{method} is a hook Lightning 2.0 removed .*"
                                                f"move its code to on_"):
        trainer.fit(module)
    import lightning.pytorch as lightning  # the peer refuses it too

    with pytest.raises(NotImplementedError, match=f"`{method}` has been removed"):
        lightning.Trainer(max_epochs=1, logger=False, **QUIET).fit(
            _peer_module(lightning, {method: lambda self, outputs: None}))


class OnEpochEnd:
    """A Lightning 1.x callback: ``on_epoch_end`` is all it has; ``on_train_epoch_end`` is
    given to the class made from it where a test needs a method Lightning 2 calls."""

    def __init__(self):
        self.calls = []

    def on_epoch_end(self, trainer, pl_module):
        self.calls.append("on_epoch_end")


def _lightning_1_callback(framework, with_current_method: bool):
    def on_train_epoch_end(self, trainer, pl_module):
        self.calls.append("on_train_epoch_end")

    body = {"on_train_epoch_end": on_train_epoch_end} if with_current_method else {}
    return type("EpochCallback", (OnEpochEnd, framework.Callback), body)()


class StepEnd(TinyRegressor):
    def training_step_end(self, outputs):
        raise AssertionError("Lightning 2 never calls training_step_end")


def test_a_lightning_1_hook_stops_ptrains_trainer_naming_where_its_code_goes(tmp_path):
    with pytest.raises(ptrain.PluginError, match=r"EpochCallback\.on_epoch_end is a hook of "
                                                 r"Lightning 1\.x .* move it to "
                                                 r"on_train_epoch_end"):
        ptrain.Trainer(accelerator="cpu", callbacks=[_lightning_1_callback(pl, True)])
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path))
    with pytest.raises(ptrain.ModelError, match=r"StepEnd\.training_step_end is a hook of "
                                                r"Lightning 1\.x .* move it to training_step"):
        trainer.fit(StepEnd())


@pytest.mark.parametrize("with_current_method", [False, True])
def test_a_lightning_1_hook_is_a_warning_under_ptrain_lightning_and_never_called_as_in_lightning(
        tmp_path, with_current_method):
    import lightning.pytorch as lightning

    calls = {}
    for framework in (lightning, pl):
        callback = _lightning_1_callback(framework, with_current_method)
        with pytest.warns(UserWarning, match="on_epoch_end is a hook of Lightning 1.x") \
                if framework is pl else contextlib.nullcontext():
            trainer = framework.Trainer(max_epochs=2, callbacks=[callback], logger=False,
                                        enable_checkpointing=False,
                                        default_root_dir=str(tmp_path), **QUIET)
            trainer.fit(StepEnd() if framework is pl else _peer_module(
                lightning, {"training_step_end": StepEnd.training_step_end}))
        calls[framework.__name__] = callback.calls
    assert calls["ptrain.lightning"] == calls["lightning.pytorch"] == \
        ["on_train_epoch_end"] * (2 if with_current_method else 0)


def _peer_module(lightning, methods: dict):
    """A small module of Lightning itself, with ``methods`` added to its class."""

    class Peer(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.zeros(8, 4), batch_size=4)

    for name, method in methods.items():
        setattr(Peer, name, method)
    return Peer()


class LogsEverything(TinyRegressor):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log_dict({"d1": loss, "d2": 2 * loss}, on_step=False, on_epoch=True,
                      sync_dist=True)
        self.log("peak", loss, on_step=False, on_epoch=True, reduce_fx="max")
        self.log("total", 1.0, on_step=False, on_epoch=True, reduce_fx=torch.sum)
        self.log("hidden", loss, logger=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        # the last validation batch is short: the mean must weigh it by its size
        self.log("val_mse", nn.functional.mse_loss(self(x), y))


def test_self_log_arguments(tmp_path):
    module = LogsEverything(n=32, batch_size=8, val_n=20)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard", "csv"],
                             num_sanity_val_steps=0)
    losses = []
    original = module.training_step

    def recording(batch, batch_idx):
        loss = original(batch, batch_idx)
        losses.append(float(loss.detach()))
        return loss

    module.training_step = recording
    trainer.fit(module)
    metrics = trainer.callback_metrics
    assert float(metrics["d2"]) == pytest.approx(2 * float(metrics["d1"]))
    assert float(metrics["peak"]) == pytest.approx(max(losses))
    assert float(metrics["total"]) == 4.0  # four batches
    assert "hidden" in metrics and "hidden" not in trainer.metrics.logged_metrics
    x, y = module.val_set.tensors
    with torch.no_grad():
        assert float(metrics["val_mse"]) == pytest.approx(
            float(nn.functional.mse_loss(module(x), y)), rel=1e-5)


def test_self_log_refuses_what_it_cannot_do(tmp_path):
    class Graph(TinyRegressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("g", loss, enable_graph=True)
            return loss

    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path))
    with pytest.raises(ptrain.ConfigError, match="enable_graph=True\\) is not supported"):
        trainer.fit(Graph())


def test_a_torchmetrics_metric_is_computed_and_reset_per_epoch(tmp_path):
    torchmetrics = pytest.importorskip("torchmetrics")

    class WithMetric(TinyRegressor):
        def __init__(self):
            super().__init__(val_n=20)
            self.mae = torchmetrics.MeanAbsoluteError()

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.mae(self(x), y)
            self.log("val_mae", self.mae)

    module = WithMetric()
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=2, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard"],
                             num_sanity_val_steps=0)
    trainer.fit(module)
    x, y = module.val_set.tensors
    with torch.no_grad():
        expected = float((module(x) - y).abs().mean())  # this epoch's only: it was reset
    assert float(trainer.callback_metrics["val_mae"]) == pytest.approx(expected, rel=1e-5)


def test_loggers_off_rank_zero_are_stand_ins_that_do_nothing():
    stand_in = NoOpLogger()
    assert stand_in.experiment.add_image("x", torch.zeros(3, 2, 2)) is stand_in


def test_toggle_optimizer_freezes_the_other_parameters_and_untoggle_restores():
    # Lightning's rule: the parameters of the run's other optimizers stop requiring gradients;
    # one that no optimizer holds keeps its setting, and a frozen one stays frozen
    module = TinyRegressor()
    frozen, loose = nn.Linear(2, 2), nn.Linear(2, 2)
    module.extra, module.loose = frozen, loose
    frozen.bias.requires_grad = False
    optimizer = torch.optim.SGD(module.net.parameters(), lr=0.1)
    other = torch.optim.SGD([*frozen.parameters(), *module.net.parameters()], lr=0.1)
    module.trainer = types.SimpleNamespace(optimizers=[optimizer, other])
    with module.toggled_optimizer(optimizer):
        assert all(p.requires_grad for p in module.net.parameters())
        assert not any(p.requires_grad for p in frozen.parameters())
        assert all(p.requires_grad for p in loose.parameters())
        assert module._param_requires_grad_state
    assert frozen.weight.requires_grad and not frozen.bias.requires_grad
    assert not module._param_requires_grad_state
    module.toggle_optimizer(other)
    assert frozen.weight.requires_grad and not frozen.bias.requires_grad
    module.untoggle_optimizer(other)
    assert frozen.weight.requires_grad and not frozen.bias.requires_grad


def test_the_native_trainer_signature_lists_every_core_option_with_its_default():
    import inspect

    from ptrain.config import core_options

    parameters = inspect.signature(ptrain.Trainer.__init__).parameters
    options = core_options().options
    named = [n for n in parameters if n not in ("self", "plugin_options", "catalog",
                                                "unknown")]
    assert set(named) == set(options)  # an IDE completes each; help(Trainer) lists them
    for name in named:
        default, core_default = parameters[name].default, options[name].default
        if name == "callbacks":  # None for the list, to keep the default immutable
            assert default is None and core_default == []
            continue
        assert default == core_default and type(default) is type(core_default), name
    with pytest.raises(ptrain.ConfigError, match="max_epoch.*Did you mean 'max_epochs'"):
        ptrain.Trainer(max_epoch=3)  # a misspelt option is named, with the closest one


class ClipsEveryOtherStep(TinyRegressor):
    def __init__(self):
        super().__init__(lr=1.0)
        self.seen = []

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None):
        self.seen.append((gradient_clip_val, gradient_clip_algorithm))
        self.before = [p.detach().clone() for p in self.parameters()]
        if self.global_step % 2 == 0:
            self.clip_gradients(optimizer, gradient_clip_val=1e-3, gradient_clip_algorithm="value")

    def on_before_zero_grad(self, optimizer):
        change = max(float((p.detach() - b).abs().max())
                     for p, b in zip(self.parameters(), self.before))
        self.changes.append(change)


def test_configure_gradient_clipping_runs_every_step_and_decides_itself(tmp_path):
    module = ClipsEveryOtherStep()
    module.changes = []
    ptrain.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=4, limit_val_batches=0,
                   default_root_dir=str(tmp_path),
                   callbacks=["no:progress-bar", "no:tensorboard"]).fit(module)
    assert module.seen == [(None, "norm")] * 4  # the trainer's settings, on every step
    clipped, free = module.changes[0::2], module.changes[1::2]
    assert all(c <= 1e-3 + 1e-7 for c in clipped)  # lr 1: a step moves by the clipped gradient
    assert all(f > 1e-3 for f in free)


class GradientInValidation(TinyRegressor):
    """A validation step that takes a gradient (as input-gradient methods do) and records
    whether its batch arrived as an inference tensor."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.seen.append(torch.is_inference(x))
        if not torch.is_inference(x):
            with torch.enable_grad():
                x = x.clone().requires_grad_(True)
                (grad,) = torch.autograd.grad(self.net(x).sum(), x)
            self.log("grad_norm", grad.norm())


@pytest.mark.parametrize("inference_mode", [True, False])
def test_inference_mode_decides_how_evaluation_runs(tmp_path, inference_mode):
    module = GradientInValidation()
    trainer = pl.Trainer(inference_mode=inference_mode, logger=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), **QUIET)
    [metrics] = trainer.validate(module)
    assert set(module.seen) == {inference_mode}
    assert ("grad_norm" in metrics) is (not inference_mode)


def test_a_second_fit_on_a_finished_trainer_trains_nothing_and_says_so(tmp_path):
    module = TinyRegressor()
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(module)
    steps, weights = trainer.global_step, [p.clone() for p in module.parameters()]
    with pytest.warns(UserWarning, match="already reached its limits.*max_epochs"):
        trainer.fit(module)
    assert trainer.global_step == steps and trainer.current_epoch == 2
    assert all(torch.equal(a, b) for a, b in zip(weights, module.parameters()))
    # raising the limit goes on from where the first fit ended
    trainer.max_epochs = 3
    trainer.fit(module)
    assert trainer.current_epoch == 3 and trainer.global_step == steps * 3 // 2


def test_a_datamodule_sees_its_trainer():
    seen = []

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            seen.append(self.trainer)
            return TinyRegressor().train_dataloader()

    data = Data()
    assert data.trainer is None
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, **QUIET)
    trainer.fit(TinyRegressor(), datamodule=data)
    assert seen == [trainer] and data.trainer is trainer


class CallbackSequence(collections.abc.Sequence):
    """A sequence that is neither a list nor a tuple, as Hydra's ListConfig."""

    def __init__(self, *items):
        self.items = items

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)


def test_callbacks_and_loggers_may_come_as_any_sequence(tmp_path):
    seen = []

    class Recorder(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            seen.append(type(self).__name__)

    class Another(Recorder):
        pass

    trainer = pl.Trainer(max_steps=1, enable_checkpointing=False,
                         callbacks=CallbackSequence(Recorder(), Another()),
                         logger=CallbackSequence(CSVLogger(tmp_path)), **QUIET)
    trainer.fit(TinyRegressor())
    # two stateless callbacks share a state_key (their class name is not the issue): both run
    assert seen == ["Recorder", "Another"]
    assert (trainer.run_dir / "metrics.csv").exists()


def test_stateless_callbacks_of_one_class_may_appear_twice():
    seen = []

    class Recorder(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            seen.append(self)

    first, second = Recorder(), Recorder()
    pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False,
               callbacks=[first, second], **QUIET).fit(TinyRegressor())
    assert seen == [first, second]


def test_stateful_callbacks_of_one_class_need_their_own_state_keys():
    import lightning.pytorch as real

    def made(base):
        class Counter(base.Callback):
            def state_dict(self):
                return {"count": 1}

        return [Counter(), Counter()]

    with pytest.raises(RuntimeError, match="more than one stateful callback"):
        real.Trainer(logger=False, callbacks=made(real), enable_progress_bar=False,
                     enable_model_summary=False)
    with pytest.raises(ptrain.PluginError, match="two callbacks .* distinct `state_key`"):
        pl.Trainer(logger=False, callbacks=made(pl), **QUIET)


def test_ckpt_path_last_without_a_checkpoint_starts_from_scratch_as_in_lightning(tmp_path):
    trainer = pl.Trainer(max_steps=2, logger=False, default_root_dir=str(tmp_path), **QUIET)
    with pytest.warns(UserWarning, match="found no checkpoint to resume.*from scratch"):
        trainer.fit(TinyRegressor(), ckpt_path="last")
    assert trainer.global_step == 2 and trainer.ckpt_path is None
    # with a dirpath, "last" looks there only
    folder = tmp_path / "ckpts"
    again = pl.Trainer(max_steps=2, logger=False, default_root_dir=str(tmp_path),
                       callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)], **QUIET)
    with pytest.warns(UserWarning, match="no last\\*.ckpt in the checkpoint callback's dirpath"):
        again.fit(TinyRegressor(), ckpt_path="last")
    resumed = pl.Trainer(max_steps=4, logger=False, default_root_dir=str(tmp_path),
                         callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)], **QUIET)
    with pytest.warns(UserWarning,
                      match="weights_only=False: the trainer.s stages read .*load_from_checkpoint"):
        resumed.fit(TinyRegressor(), ckpt_path="last", weights_only=False)
    assert resumed.ckpt_path == str(folder / "last.ckpt") and resumed.global_step == 4


def test_a_progress_bar_callback_with_the_progress_bar_off_is_refused():
    from ptrain.lightning.callbacks import TQDMProgressBar

    with pytest.raises(ptrain.ConfigError, match="enable_progress_bar=False.*TQDMProgressBar"):
        pl.Trainer(enable_progress_bar=False, callbacks=[TQDMProgressBar()])


def test_validation_step_none_or_missing_runs_no_validation(tmp_path):
    class Watched(TinyRegressor):
        def __init__(self):
            super().__init__()
            self.validated = 0

        def on_validation_start(self):
            self.validated += 1

    module = Watched()
    module.validation_step = None  # Lightning's way to switch validation off
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, **QUIET)
    trainer.fit(module)
    assert module.validated == 0 and trainer.global_step > 0
    with pytest.raises(ptrain.ModelError, match="has no validation_step"):
        trainer.validate(module)


def test_several_early_stopping_callbacks_each_take_part(tmp_path):
    from ptrain.lightning.callbacks import EarlyStopping

    patient = EarlyStopping(monitor="val_loss", patience=100)
    eager = EarlyStopping(monitor="val_loss", patience=0, stopping_threshold=1e9)
    trainer = pl.Trainer(max_epochs=5, logger=False, enable_checkpointing=False,
                         callbacks=[patient, eager], **QUIET)
    trainer.fit(TinyRegressor())
    assert trainer.early_stopping_callbacks == [patient, eager]
    assert trainer.current_epoch == 1  # the second one stopped the run after one epoch


def test_model_checkpoint_takes_one_trigger_as_lightnings_does():
    with pytest.raises(ptrain.ConfigError, match="every_n_train_steps=2, every_n_epochs=1"):
        ModelCheckpoint(every_n_train_steps=2, every_n_epochs=1)
    timed = ModelCheckpoint(train_time_interval=60)
    assert (timed.every_n_epochs, timed.every_n_train_steps) == (0, 0)


def test_a_model_checkpoint_subclass_overriding_lightnings_methods_is_refused_when_made():
    """ptrain's checkpoint callback never calls them (scvi-tools' ``SaveCheckpoint`` overrides
    ``on_train_end``): it was a warning, then the fit stopped at registration."""

    class SaveAtTheEnd(ModelCheckpoint):
        def on_train_end(self, trainer, pl_module):
            raise AssertionError("never called")

    with pytest.raises(ptrain.ConfigError, match="SaveAtTheEnd overrides on_train_end of "
                                                 "ModelCheckpoint.*separate Callback"):
        SaveAtTheEnd()


def test_a_model_checkpoint_subclass_overriding_lightnings_saving_methods_is_refused(tmp_path):
    """SchNetPack's ModelCheckpoint overrides ``_update_best_and_save`` to also save the best
    model for inference: Lightning calls it at each top-k save; ptrain's checkpoint callback
    has no such method, so the override was silently never called."""
    lightning = pytest.importorskip("lightning.pytorch")

    def subclass(base):
        class SaveBestToo(base):
            calls = 0

            def _update_best_and_save(self, current, trainer, monitor_candidates):
                type(self).calls += 1
                super()._update_best_and_save(current, trainer, monitor_candidates)

        return SaveBestToo

    class Logged(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    theirs = subclass(lightning.callbacks.ModelCheckpoint)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)))
    lightning.Trainer(default_root_dir=tmp_path, max_epochs=2, logger=False,
                      callbacks=[theirs(monitor="loss")], **QUIET).fit(Logged(), data)
    assert theirs.calls >= 1  # the oracle calls the override
    with pytest.raises(ptrain.ConfigError, match="SaveBestToo overrides _update_best_and_save "
                                                 "of ModelCheckpoint.*never run"):
        subclass(ModelCheckpoint)(monitor="loss")


def test_early_stopping_says_why_with_lightnings_attributes():
    from ptrain.lightning.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason

    never = EarlyStopping(monitor="val_loss", patience=100)
    at_once = EarlyStopping(monitor="val_loss", stopping_threshold=1e9)
    assert never.stopped_epoch == 0 and never.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    assert float(never.best_score) == float("inf")
    pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False,
               callbacks=[never, at_once], **QUIET).fit(TinyRegressor())
    assert at_once.stopping_reason is EarlyStoppingReason.STOPPING_THRESHOLD
    # headed by Lightning's phrase, which programs match on
    assert at_once.stopping_reason_message.startswith("Stopping threshold reached: val_loss = ")
    assert never.stopping_reason_message is None
    assert never.wait_count == 0 and float(never.best_score) == never.best


def test_lightnings_submodules_are_attributes_and_logger_paths_import():
    assert pl.callbacks.Callback is pl.Callback
    assert pl.loggers.CSVLogger is CSVLogger
    assert pl.utilities.rank_zero_only is not None
    from ptrain.lightning.loggers.comet import CometLogger
    from ptrain.lightning.loggers.neptune import NeptuneLogger

    for refused in (CometLogger, NeptuneLogger):
        with pytest.raises(ptrain.ConfigError, match="no ptrain logger plugin"):
            refused()


def test_lightning_utilities_rank_is_set_on_import():
    lightning_utilities = pytest.importorskip("lightning_utilities.core.rank_zero")
    assert isinstance(lightning_utilities.rank_zero_only.rank, int)


def test_wandb_logger_passes_its_other_arguments_to_wandb_init(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from ptrain.lightning.loggers.wandb import WandbLogger
    from tests.plugins.callbacks.test_loggers import wandb_contents

    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="p", save_dir=str(tmp_path), offline=True, job_type="probe",
                         group="g")
    trainer = pl.Trainer(max_steps=2, logger=logger, enable_checkpointing=False, **QUIET)
    trainer.fit(TinyRegressor())
    run = wandb_contents(logger._run.last_run_dir)["run"]
    assert (run.project, run.job_type, run.run_group) == ("p", "probe", "g")


def test_trainer_callbacks_holds_the_callback_objects_as_lightnings_does():
    """pytorch-forecasting's ``predict_step`` finds its prediction writer in
    ``self.trainer.callbacks``; Lightning's list holds the objects given, in their order, then
    the defaults it made, the checkpoint callbacks last."""
    from ptrain.lightning.callbacks import (BasePredictionWriter, EarlyStopping,
                                            LearningRateMonitor, TQDMProgressBar)

    class Writer(BasePredictionWriter):
        def write_on_batch_end(self, *args):
            pass

    class Finder(TinyRegressor):
        def predict_step(self, batch, batch_idx):
            found.append([c for c in self.trainer.callbacks if isinstance(c, Writer)])
            return self(batch[0])

    found = []
    checkpoint, writer = ModelCheckpoint(), Writer("batch")
    stop, monitor = EarlyStopping(monitor="val_loss"), LearningRateMonitor()
    trainer = pl.Trainer(logger=False, callbacks=[checkpoint, writer, stop, monitor])
    listed = trainer.callbacks
    assert listed[:3] == [writer, stop, monitor] and listed[-1] is checkpoint
    assert [type(c) for c in listed] == [Writer, EarlyStopping, LearningRateMonitor,
                                         TQDMProgressBar, ModelCheckpoint]
    assert pl.Trainer(logger=False, enable_checkpointing=False, **QUIET).callbacks == []
    trainer = pl.Trainer(logger=False, callbacks=writer, **QUIET)
    module = Finder()
    trainer.predict(module, module.train_dataloader())
    assert found and all(entry == [writer] for entry in found)
    assert "no:tensorboard" in trainer.options["callbacks"] and trainer.callbacks[0] is writer
    # the list is the run's: replacing it after construction is refused, not dropped unsaid
    with pytest.raises(ptrain.ConfigError, match="trainer.callbacks can't be replaced once"):
        trainer.callbacks = []
    # nor changed in place: an appended callback would never run (the list is a copy)
    before = list(trainer.callbacks)
    for change in (lambda c: c.append(stop), lambda c: c.insert(0, stop),
                   lambda c: c.extend([stop]), lambda c: c.pop(), lambda c: c.__iadd__([stop]),
                   lambda c: c.__setitem__(0, stop)):
        with pytest.raises(ptrain.ConfigError, match="can't be changed once.*configure_callb"):
            change(trainer.callbacks)
    assert trainer.callbacks == before and trainer.callbacks[0] is writer
