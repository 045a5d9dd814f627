"""``self.log`` and the metrics a ``ptrain.lightning`` run keeps, against Lightning 2.6.6 (the
oracle, installed) running the same program: the names in ``logged_metrics``,
``callback_metrics`` and ``progress_bar_metrics`` and their values, ``reduce_fx`` as Lightning
reads it, several evaluation dataloaders (``dataloader_idx``, ``/dataloader_idx_N`` names, one
result per dataloader), a callback's ``self.log``, and the refusals Lightning makes too."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch", reason="the oracle: pip install lightning==2.6.6")

from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

import ptrain  # noqa: E402
import ptrain.lightning as ppl  # noqa: E402

FRAMEWORKS = {"lightning": pl, "ptrain": ppl}
LIGHTNING_ERRORS = (ValueError, MisconfigurationException)


def _data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def _loader(n: int = 8, seed: int = 0, batch_size: int = 2) -> DataLoader:
    return DataLoader(_data(n, seed), batch_size=batch_size)


def base_module(framework):
    """A linear regression module of ``framework`` (``pl`` or ``ppl``), the same weights under
    both from the same seed; subclasses log."""

    class Base(framework.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(3, 1)

        def forward(self, x):
            return self.net(x)

        def loss(self, batch):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def training_step(self, batch, batch_idx):
            return self.loss(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self):
            return _loader(8, 0)

        def val_dataloader(self):
            return _loader(6, 1)

        def test_dataloader(self):
            return _loader(6, 2)

    return Base


def run(framework, make_module, tmp_path, stage: str = "fit", callbacks=(), **options):
    """``make_module(framework)`` trained (or tested, ...) by ``framework``'s Trainer; returns
    (trainer, module, what the stage returned)."""
    torch.manual_seed(0)
    module = make_module(framework)()
    settings = dict(default_root_dir=str(tmp_path / framework.__name__), max_epochs=2,
                    accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, logger=False, log_every_n_steps=1,
                    num_sanity_val_steps=0, callbacks=list(callbacks))
    settings.update(options)
    trainer = framework.Trainer(**settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        returned = getattr(trainer, stage)(module)
    return trainer, module, returned


def both(make_module, tmp_path, stage="fit", callbacks=None, **options):
    """The same program under Lightning and ptrain: {framework name: (trainer, module, result)};
    ``callbacks(framework)`` makes the callbacks of each."""
    return {name: run(framework, make_module, tmp_path, stage,
                      callbacks(framework) if callbacks else (), **options)
            for name, framework in FRAMEWORKS.items()}


def numbers(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


# ---------------------------------------------------------------------------------------------
# The three dicts: names, kinds and values


def logging_everywhere(framework):
    class Module(base_module(framework)):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("default", loss)
            self.log("l_s", loss, on_step=True, on_epoch=False)
            self.log("l_e", loss, on_step=False, on_epoch=True)
            self.log("l_se", loss, on_step=True, on_epoch=True)
            self.log("p_s", loss, on_step=True, on_epoch=False, prog_bar=True, logger=False)
            self.log("p_se", loss, on_step=True, on_epoch=True, prog_bar=True, logger=False)
            self.log_dict({"d1": loss, "d2": 2.0})
            return loss

        def validation_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("v", loss)
            self.log("v_se", loss, on_step=True, on_epoch=True, prog_bar=True)
            self.log("v_s", loss, on_step=True, on_epoch=False, prog_bar=True)

        def on_validation_epoch_end(self):
            self.log("v_end", torch.tensor(3.0), prog_bar=True)

        def on_train_epoch_end(self):
            self.log("t_end", 4)

    return Module


def test_logged_callback_and_progress_bar_metrics_match_lightning(tmp_path):
    runs = both(logging_everywhere, tmp_path)
    (lt, _, _), (pt, _, _) = runs["lightning"], runs["ptrain"]
    assert set(pt.logged_metrics) == set(lt.logged_metrics)
    assert set(pt.callback_metrics) == set(lt.callback_metrics)
    assert set(pt.progress_bar_metrics) == set(lt.progress_bar_metrics)
    # Lightning's kinds: tensors in the first two, numbers in the progress bar's
    for metrics in (pt.logged_metrics, pt.callback_metrics):
        assert all(isinstance(v, torch.Tensor) for v in metrics.values())
    assert all(isinstance(v, float) for v in pt.progress_bar_metrics.values())
    for name, value in numbers(lt.callback_metrics).items():
        assert float(pt.callback_metrics[name]) == pytest.approx(value, rel=1e-5), name
    for name, value in numbers(lt.logged_metrics).items():
        assert float(pt.logged_metrics[name]) == pytest.approx(value, rel=1e-5), name
    for name, value in lt.progress_bar_metrics.items():
        assert pt.progress_bar_metrics[name] == pytest.approx(value, rel=1e-5), name


def reductions(framework):
    class Module(base_module(framework)):
        def training_step(self, batch, batch_idx):
            value = torch.tensor(batch_idx, dtype=torch.long)
            for name, fx in (("min", min), ("max", max), ("sum", sum), ("torch_max", torch.max),
                             ("SUM", "SUM"), ("avg", "avg"), ("Max", "Max")):
                self.log(f"t_{name}", value, on_step=False, on_epoch=True, reduce_fx=fx)
            self.log("t_step_sum", value, reduce_fx="sum")
            return self.loss(batch)

        def validation_step(self, batch, batch_idx):
            self.log("v_min", float(batch_idx), reduce_fx=min)
            self.log("v_sum", float(batch_idx), reduce_fx=torch.sum)

    return Module


def test_reduce_fx_as_lightning_reads_it(tmp_path):
    runs = both(reductions, tmp_path)
    lightning, ours = runs["lightning"][0].logged_metrics, runs["ptrain"][0].logged_metrics
    assert set(ours) == set(lightning)
    assert numbers(ours) == pytest.approx(numbers(lightning))


# ---------------------------------------------------------------------------------------------
# Several evaluation dataloaders


def several_loaders(framework):
    class Module(base_module(framework)):
        seen: list = []

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            loss = self.loss(batch)
            self.log("val_loss", loss, on_step=True, on_epoch=True)
            self.log(f"named_{dataloader_idx}", loss, add_dataloader_idx=False)
            self.log("common", 1.0 + dataloader_idx)

        test_step = validation_step

        def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
            self.seen.append((batch_idx, dataloader_idx))

        def on_validation_epoch_end(self):
            self.log("after", 5.0)

        on_test_epoch_end = on_validation_epoch_end

        def val_dataloader(self):
            return [_loader(6, 1), _loader(4, 3)]

        def test_dataloader(self):
            return {"a": _loader(6, 2), "b": _loader(2, 4)}

    return Module


def test_several_validation_dataloaders_as_lightning(tmp_path):
    runs = both(several_loaders, tmp_path, max_epochs=1, limit_val_batches=2)
    (lt, lm, _), (pt, pm, _) = runs["lightning"], runs["ptrain"]
    assert set(pt.logged_metrics) == set(lt.logged_metrics)
    assert "val_loss_epoch/dataloader_idx_1" in pt.logged_metrics
    assert set(pt.callback_metrics) == set(lt.callback_metrics)
    assert numbers(pt.callback_metrics) == pytest.approx(numbers(lt.callback_metrics), rel=1e-5)
    # the hooks get the index: each loader's batches, up to the limit each, one after the other
    assert pm.seen == lm.seen == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_several_test_dataloaders_return_one_result_each(tmp_path):
    runs = both(several_loaders, tmp_path, stage="test")
    lightning, ours = runs["lightning"][2], runs["ptrain"][2]
    assert len(ours) == len(lightning) == 2
    for mine, theirs in zip(ours, lightning):
        assert mine == pytest.approx(numbers(theirs), rel=1e-5)


def test_a_step_without_dataloader_idx_under_several_dataloaders_is_refused(tmp_path):
    class Module(several_loaders(ppl)):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.loss(batch))

    trainer = ppl.Trainer(default_root_dir=str(tmp_path), max_epochs=1, logger=False,
                          enable_progress_bar=False, enable_checkpointing=False,
                          enable_model_summary=False)
    with pytest.raises(ptrain.ModelError, match="2 dataloaders.*dataloader_idx"):
        trainer.validate(Module())


def test_predict_with_several_dataloaders_returns_a_list_per_dataloader(tmp_path):
    def make(framework):
        class Module(base_module(framework)):
            def predict_step(self, batch, batch_idx, dataloader_idx=0):
                return self(batch[0]) * 0 + dataloader_idx

            def predict_dataloader(self):
                return [_loader(4, 1), _loader(2, 2)]

        return Module

    runs = both(make, tmp_path, stage="predict")
    lightning, ours = runs["lightning"][2], runs["ptrain"][2]
    assert [len(x) for x in ours] == [len(x) for x in lightning] == [2, 1]
    for mine, theirs in zip(ours, lightning):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_val_dataloader_set_to_none_runs_no_validation(tmp_path):
    def make(framework):
        module = logging_everywhere(framework)()
        module.val_dataloader = None  # Lightning's switch
        return lambda: module

    runs = both(lambda f: make(f), tmp_path, max_epochs=1)
    assert set(runs["ptrain"][0].logged_metrics) == set(runs["lightning"][0].logged_metrics)
    assert not any(n.startswith("v") for n in runs["ptrain"][0].logged_metrics)


# ---------------------------------------------------------------------------------------------
# A callback's self.log


def test_a_callback_logs_through_the_module(tmp_path):
    def callbacks(framework):
        class Logging(framework.Callback):
            def on_train_start(self, trainer, pl_module):
                pl_module.log("on_train_start", 1)

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                pl_module.log("on_train_batch_end", float(batch_idx), prog_bar=True)

            def on_validation_epoch_end(self, trainer, pl_module):
                pl_module.log_dict({"cb_val": 7.0})

        return [Logging()]

    runs = both(base_module, tmp_path, callbacks=callbacks, max_epochs=1)
    (lt, _, _), (pt, _, _) = runs["lightning"], runs["ptrain"]
    assert numbers(pt.callback_metrics) == numbers(lt.callback_metrics)
    assert pt.progress_bar_metrics == lt.progress_bar_metrics


def test_a_callback_logs_with_self_log_as_in_lightning(tmp_path):
    """Lightning hands each callback its stage's module's ``log`` and ``log_dict`` when the
    stage starts; a callback's ``self.log`` was an AttributeError."""
    def callbacks(framework):
        class Logging(framework.Callback):
            def on_train_epoch_start(self, trainer, pl_module):
                self.log("epoch_start", 2.0)

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.log("batch_end", float(batch_idx), prog_bar=True)

            def on_validation_epoch_end(self, trainer, pl_module):
                self.log_dict({"cb_val": 7.0, "cb_other": 1.0})

        return [Logging()]

    def module(framework):
        class Validated(base_module(framework)):
            def validation_step(self, batch, batch_idx):
                self.log("val_loss", self.loss(batch))

            def val_dataloader(self):
                return _loader(4, 1)

        return Validated

    runs = both(module, tmp_path, callbacks=callbacks, max_epochs=1)
    (lt, _, _), (pt, _, _) = runs["lightning"], runs["ptrain"]
    assert {"epoch_start", "batch_end", "cb_val"} <= set(lt.callback_metrics)
    assert numbers(pt.callback_metrics) == numbers(lt.callback_metrics)
    assert pt.progress_bar_metrics == lt.progress_bar_metrics
    validated = pt.validate(pt.lightning_module, _loader(4, 1), verbose=False)
    assert validated[0]["cb_val"] == 7.0  # a second stage's module: the callback logs there


def test_a_callback_with_a_log_method_of_its_own_keeps_it(tmp_path):
    """Lightning replaces it with the module's (on purpose not here: docs/from-lightning.md)."""
    class OwnLog(ppl.Callback):
        def __init__(self):
            self.said = []

        def log(self, text):
            self.said.append(text)

        def on_train_end(self, trainer, pl_module):
            self.log("done")

    own = OwnLog()
    run(ppl, base_module, tmp_path, callbacks=[own], max_epochs=1)
    assert own.said == ["done"] and "log" not in vars(own)


def test_the_sanity_checks_values_are_read_where_it_ends_and_gone_after_as_in_lightning(
        tmp_path):
    """neuralforecast logs its validation loss in ``on_validation_epoch_end``; a callback read
    no sanity-check value in ``on_validation_end`` (Lightning's holds it until the check
    ends)."""
    def make(framework):
        class Module(base_module(framework)):
            def validation_step(self, batch, batch_idx):
                self.log("val_step", self.loss(batch))

            def on_validation_epoch_end(self):
                self.log("val_epoch_end", 3.0 + self.global_step)

        return Module

    def callbacks(framework):
        class Reading(framework.Callback):
            def __init__(self):
                self.seen = []

            def read(self, trainer, where):
                self.seen.append((where, trainer.sanity_checking, numbers(
                    trainer.callback_metrics)))

            def on_validation_end(self, trainer, pl_module):
                self.read(trainer, "on_validation_end")

            def on_sanity_check_end(self, trainer, pl_module):
                self.read(trainer, "on_sanity_check_end")

            def on_train_start(self, trainer, pl_module):
                self.read(trainer, "on_train_start")

        return [Reading()]

    runs = both(make, tmp_path, callbacks=callbacks, max_epochs=1, num_sanity_val_steps=2)
    (lt, _, _), (pt, _, _) = runs["lightning"], runs["ptrain"]
    seen = pt.callbacks[0].seen
    assert [s[:2] for s in seen] == [s[:2] for s in lt.callbacks[0].seen]
    for (where, _, ours), (_, _, theirs) in zip(seen, lt.callbacks[0].seen):
        assert ours.keys() == theirs.keys(), where
        assert ours == pytest.approx(theirs, rel=1e-6), where
    assert seen[0][:2] == ("on_validation_end", True) and seen[0][2]["val_epoch_end"] == 3.0
    assert seen[2] == ("on_train_start", False, {})


def test_the_epoch_end_hooks_read_a_logged_metric_objects_epoch_value_as_in_lightning(tmp_path):
    """PyG's examples log a torchmetrics ``Accuracy`` object per epoch; a callback's (and the
    module's) ``on_validation_epoch_end`` and ``on_train_epoch_end`` read its value in
    ``trainer.callback_metrics`` under Lightning, where ptrain showed the previous epoch's
    value (none in the first epoch) as only the logged numbers were previewed there. One
    object logged under two names has its value under both (ptrain reset it after computing
    the first, so the second read NaN)."""
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(framework):
        class Module(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.train_mean = torchmetrics.MeanMetric()
                self.val_mean = torchmetrics.MeanMetric()
                self.seen = []

            def training_step(self, batch, batch_idx):
                loss = self.loss(batch)
                self.train_mean(loss)
                self.log("train_mean", self.train_mean, on_step=False, on_epoch=True)
                self.log("train_both", self.train_mean, on_step=True, on_epoch=True)
                return loss

            def validation_step(self, batch, batch_idx):
                self.val_mean.update(self.loss(batch))
                self.log("val_mean", self.val_mean)

            def on_validation_epoch_end(self):
                self.seen.append(("module", numbers(self.trainer.callback_metrics)))

        return Module

    def callbacks(framework):
        class Reading(framework.Callback):
            def __init__(self):
                self.seen = []

            def on_validation_epoch_end(self, trainer, pl_module):
                self.seen.append(("validation", numbers(trainer.callback_metrics)))

            def on_train_epoch_end(self, trainer, pl_module):
                self.seen.append(("train", numbers(trainer.callback_metrics)))

        return [Reading()]

    runs = both(make, tmp_path, callbacks=callbacks, max_epochs=2, num_sanity_val_steps=1)
    (lt, lm, _), (pt, pm, _) = runs["lightning"], runs["ptrain"]
    for ours, theirs in ((pt.callbacks[0].seen, lt.callbacks[0].seen), (pm.seen, lm.seen)):
        assert [where for where, _ in ours] == [where for where, _ in theirs]
        for (where, mine), (_, lightnings) in zip(ours, theirs):
            assert {"val_mean"} <= lightnings.keys(), where
            assert mine.keys() == lightnings.keys(), where
            assert mine == pytest.approx(lightnings, rel=1e-6), where


# ---------------------------------------------------------------------------------------------
# Refused, as Lightning refuses them


def refusing(value=None, **log_arguments):
    def make(framework):
        class Module(base_module(framework)):
            def training_step(self, batch, batch_idx):
                self.log("foo", 1.0 if value is None else value, **log_arguments)
                return self.loss(batch)

        return Module

    return make


@pytest.mark.parametrize(("make", "lightning_error"), [
    (refusing(on_step=False, on_epoch=False), "is not useful"),
    (refusing(reduce_fx="median"), "reduce_fx"),
    (refusing({"a": 1}), "values cannot be logged"),
    (refusing([1, 2]), "values cannot be logged"),
    (refusing("1.0"), "values cannot be logged"),
    (refusing(torch.ones(2)), "single element"),
])
def test_what_self_log_refuses(tmp_path, make, lightning_error):
    """Lightning raises a ValueError or its MisconfigurationException; ptrain a ConfigError,
    which is a ValueError and what ptrain.lightning names MisconfigurationException."""
    with pytest.raises(LIGHTNING_ERRORS, match=lightning_error):
        run(pl, make, tmp_path, max_epochs=1)
    with pytest.raises(ptrain.ConfigError):
        run(ppl, make, tmp_path, max_epochs=1)


def test_a_dataloader_idx_in_the_name_is_refused(tmp_path):
    make = refusing()

    def named(framework):
        class Module(make(framework)):
            def training_step(self, batch, batch_idx):
                self.log("foo/dataloader_idx_0", 1.0)
                return self.loss(batch)

        return Module

    with pytest.raises(LIGHTNING_ERRORS, match="dataloader_idx"):
        run(pl, named, tmp_path, max_epochs=1)
    with pytest.raises(ptrain.ConfigError, match="dataloader_idx"):
        run(ppl, named, tmp_path, max_epochs=1)


def test_a_metric_not_held_by_the_module_is_refused(tmp_path):
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(framework):
        class Module(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.held = torchmetrics.MeanMetric()

            def training_step(self, batch, batch_idx):
                loose = torchmetrics.MeanMetric()
                loose.update(1.0)
                self.log("loose", loose)
                return self.loss(batch)

        return Module

    with pytest.raises(LIGHTNING_ERRORS, match="held"):
        run(pl, make, tmp_path, max_epochs=1)
    with pytest.raises(ptrain.ConfigError, match="metric_attribute=NAME\\) with NAME one of "
                                                 "\\['held'\\]"):
        run(ppl, make, tmp_path, max_epochs=1)


def test_a_metric_only_updated_in_the_step_runs_as_in_lightning_and_says_so(tmp_path):
    # the tutorials' pattern: metric.update(...) then self.log(name, metric) in training_step,
    # where the default is per step: Lightning publishes nothing for the step, silently
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(framework):
        class Module(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.seen = torchmetrics.SumMetric()
                self.both = torchmetrics.SumMetric()

            def training_step(self, batch, batch_idx):
                self.seen.update(1.0)
                self.log("seen", self.seen)
                self.both.update(1.0)
                self.log("both", self.both, on_step=True, on_epoch=True)
                return self.loss(batch)

        return Module

    runs = both(make, tmp_path, max_epochs=1)
    (lt, _, _), (pt, _, _) = runs["lightning"], runs["ptrain"]
    assert set(pt.callback_metrics) == set(lt.callback_metrics)
    assert "seen" not in pt.callback_metrics and "both_step" not in pt.callback_metrics
    assert float(pt.callback_metrics["both_epoch"]) == float(lt.callback_metrics["both_epoch"])
    torch.manual_seed(0)
    trainer = ppl.Trainer(default_root_dir=str(tmp_path / "said"), max_epochs=1,
                          accelerator="cpu", enable_progress_bar=False, logger=False,
                          enable_checkpointing=False, enable_model_summary=False)
    with pytest.warns(UserWarning) as said:
        trainer.fit(make(ppl)())
    texts = [str(w.message) for w in said if "only update()d" in str(w.message)]
    assert len(texts) == 2, texts  # once per name, not once per step
    assert any("'seen'" in t and "nothing is published" in t for t in texts), texts
    assert any("'both'" in t and "epoch value is still published" in t for t in texts), texts


def test_a_composed_metric_and_its_parts_all_publish_their_epoch_values_as_in_lightning(
        tmp_path):
    # scvi-tools logs elbo = rec + kl (a torchmetrics CompositionalMetric, updated alone: it
    # updates its parts) together with rec and kl; resetting elbo resets its parts, so each
    # logged metric must be computed before any is reset (the parts were NaN, 0/0)
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(framework):
        class Module(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.rec, self.kl = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()
                self.elbo = self.rec + 0.5 * self.kl

            def validation_step(self, batch, batch_idx):
                loss = self.loss(batch)
                self.elbo.update(loss)
                self.log_dict({"elbo": self.elbo, "rec": self.rec, "kl": self.kl},
                              on_step=False, on_epoch=True)

        return Module

    runs = both(make, tmp_path, max_epochs=1)
    lightning, ours = (numbers(runs[name][0].callback_metrics) for name in FRAMEWORKS)
    assert set(ours) == set(lightning) == {"elbo", "rec", "kl"}
    assert all(value == value for value in ours.values()), ours  # no NaN
    assert ours == pytest.approx(lightning, rel=1e-6)


def test_the_epoch_end_hooks_read_a_logged_metrics_epoch_value_as_in_lightning(tmp_path):
    # scvi-tools steps ReduceLROnPlateau in on_validation_epoch_end with
    # trainer.callback_metrics["elbo_validation"], a torchmetrics Metric logged on epoch: a
    # KeyError before (only the plain values' aggregates were there)
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(framework):
        class Module(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.metric, self.read = torchmetrics.MeanMetric(), []

            def validation_step(self, batch, batch_idx):
                self.metric.update(self.loss(batch))
                self.log("val_metric", self.metric, on_step=False, on_epoch=True)

            def on_validation_epoch_end(self):
                self.read.append(float(self.trainer.callback_metrics["val_metric"]))

        return Module

    runs = both(make, tmp_path, max_epochs=2)
    lightning, ours = (runs[name][1].read for name in FRAMEWORKS)
    assert len(ours) == 2 and ours == pytest.approx(lightning, rel=1e-6)
    published = (float(runs[name][0].callback_metrics["val_metric"]) for name in FRAMEWORKS)
    assert next(published) == pytest.approx(next(published), rel=1e-6)


def test_a_metric_called_as_the_loss_publishes_its_step_value_without_the_graph(tmp_path):
    # chemprop logs its criterion, a Metric whose forward returns the loss it trains on: the
    # step value published is that tensor, which held the step's graph (a warning when read as
    # a number, the graph kept alive until the next step)
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(framework):
        class Module(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.criterion = torchmetrics.MeanSquaredError()

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = self.criterion(self(x), y)
                self.log("train_loss", self.criterion, on_step=True, on_epoch=True)
                return loss

        return Module

    runs = both(make, tmp_path, max_epochs=1)
    (lt, _, _), (pt, _, _) = runs["lightning"], runs["ptrain"]
    for metrics in ("callback_metrics", "logged_metrics"):
        lightnings, ours = getattr(lt, metrics), getattr(pt, metrics)
        assert numbers(ours) == numbers(lightnings)
        assert not any(v.requires_grad for v in lightnings.values())
        assert [k for k, v in ours.items() if v.requires_grad] == []


def test_on_train_batch_end_gets_the_loss_without_its_graph_as_in_lightning(tmp_path):
    # a callback that keeps outputs["loss"] of every step kept every step's graph
    def callbacks(framework):
        class Keep(framework.Callback):
            def __init__(self):
                self.losses = []

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.losses.append(outputs["loss"])

        return [Keep()]

    runs = both(base_module, tmp_path, max_epochs=1, callbacks=callbacks)
    lightnings, ours = (runs[name][0].callbacks[0].losses for name in ("lightning", "ptrain"))
    assert [float(v) for v in ours] == [float(v) for v in lightnings] and len(ours) == 4
    assert not any(v.requires_grad for v in lightnings)
    assert not any(v.requires_grad for v in ours)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_on_train_batch_end_gets_what_training_step_returned_as_in_lightning(tmp_path,
                                                                             accumulate):
    # programs collect their predictions there since Lightning 2 dropped training_epoch_end:
    # only the loss came through, and undivided under accumulation
    def dict_module(framework):
        class Returns(base_module(framework)):
            def training_step(self, batch, batch_idx):
                return {"loss": self.loss(batch), "preds": self(batch[0]).detach(),
                        "index": batch_idx}

            def on_train_batch_end(self, outputs, batch, batch_idx):
                self.kept = getattr(self, "kept", []) + [outputs]

        return Returns

    runs = both(dict_module, tmp_path, max_epochs=1, accumulate_grad_batches=accumulate)
    lightnings, ours = (runs[name][1].kept for name in ("lightning", "ptrain"))
    assert [sorted(o) for o in ours] == [sorted(o) for o in lightnings] == [
        ["index", "loss", "preds"]] * 4
    for mine, theirs in zip(ours, lightnings):
        assert mine["index"] == theirs["index"]
        assert torch.equal(mine["preds"], theirs["preds"])
        assert float(mine["loss"]) == float(theirs["loss"]) and not mine["loss"].requires_grad


@pytest.mark.parametrize("returned", ["none", "dict without loss"])
def test_on_train_batch_end_outputs_without_a_loss_are_lightnings(tmp_path, returned):
    # manual optimization: Lightning passes {} for None and the dict without a loss as it is
    def manual_module(framework):
        class Manual(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False

            def training_step(self, batch, batch_idx):
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(self.loss(batch))
                optimizer.step()
                return None if returned == "none" else {"index": batch_idx}

            def on_train_batch_end(self, outputs, batch, batch_idx):
                self.kept = getattr(self, "kept", []) + [outputs]

        return Manual

    runs = both(manual_module, tmp_path, max_epochs=1)
    lightnings, ours = (runs[name][1].kept for name in ("lightning", "ptrain"))
    assert ours == lightnings == ([{}] * 4 if returned == "none" else
                                  [{"index": i} for i in range(4)])


def test_epoch_values_of_a_64_true_run_keep_float64_as_lightnings(tmp_path):
    # darts fits float64 series under precision="64-true"; its val_loss was rounded to float32
    def run(name):
        framework = FRAMEWORKS[name]
        torch.manual_seed(0)

        class Doubles(framework.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                loss = self.layer(batch[0]).pow(2).mean()
                self.log("train_loss", loss, on_epoch=True)
                return loss

            def validation_step(self, batch, batch_idx):
                self.log("val_loss", self.layer(batch[0]).pow(2).mean() / 3,
                         batch_size=len(batch[0]))

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        data = TensorDataset(torch.randn(8, 2, dtype=torch.float64))
        val = TensorDataset(torch.randn(7, 2, dtype=torch.float64))
        trainer = framework.Trainer(default_root_dir=tmp_path / name, max_epochs=1,
                                    precision="64-true", logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False,
                                    enable_model_summary=False)
        trainer.fit(Doubles(), DataLoader(data, batch_size=3), DataLoader(val, batch_size=3))
        return {k: (v.item(), v.dtype) for k, v in trainer.callback_metrics.items()}

    lightning, ours = run("lightning"), run("ptrain")
    assert ours == lightning
    assert ours["val_loss"][1] == ours["train_loss_epoch"][1] == torch.float64


def test_a_metric_logged_per_step_only_is_reset_at_the_epochs_end_as_in_lightning(tmp_path):
    # SchNetPack logs its train metrics with on_step=True, on_epoch=False (their forward's batch
    # value): they were never reset, so their state grew over the whole fit and the last
    # forward's graph stayed alive (deepcopying them, in save_hyperparameters, then failed)
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(framework):
        class Module(base_module(framework)):
            def __init__(self):
                super().__init__()
                self.train_mae = torchmetrics.MeanAbsoluteError()
                self.train_cat = torchmetrics.CatMetric()
                self.val_mae = torchmetrics.MeanAbsoluteError()

            def training_step(self, batch, batch_idx):
                x, y = batch
                out = self(x)
                self.train_mae(out, y)
                self.log("train_mae", self.train_mae, on_step=True, on_epoch=False)
                self.train_cat(out.detach().sum())
                self.log("train_cat", self.train_cat, on_step=True, on_epoch=False,
                         reduce_fx="sum")
                return nn.functional.mse_loss(out, y)

            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.val_mae(self(x), y)
                self.log("val_mae", self.val_mae, on_step=True, on_epoch=False)

        return Module

    runs = both(make, tmp_path, max_epochs=2)

    def states(module):
        return {name: (metric._update_count, metric._forward_cache is None,
                       {k: [t.tolist() for t in v] if isinstance(v, list) else v.tolist()
                        for k, v in metric.metric_state.items()})
                for name, metric in (("train_mae", module.train_mae),
                                     ("train_cat", module.train_cat),
                                     ("val_mae", module.val_mae))}

    lightnings, ours = runs["lightning"][1], runs["ptrain"][1]
    assert states(ours) == states(lightnings)
    assert ours.train_mae._update_count == 0
    import copy
    copy.deepcopy(ours.train_mae)  # no step's graph left in it
