"""The ``learning-rate-monitor`` callback (distribution ``ptrain-lr-monitor``): real fits, the
values read back from the TensorBoard event files and from a recording ``log_metrics`` plugin,
and the metric names compared with those Lightning's ``LearningRateMonitor`` logs for the same
optimizers (Lightning runs in the test when it is installed)."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain
from ptrain import ConfigError
from ptrain_lr_monitor import LearningRateMonitor
from tests._cli_util import assert_usage_error
from tests.conftest import REPO, TinyRegressor, run_cli

QUIET = ["no:progress-bar", "no:checkpoint", "no:model-summary"]
STEPS_PER_EPOCH = 8  # TinyRegressor: 64 samples in batches of 8


class MetricsRecorder:
    """A logger: keeps every ``log_metrics`` call as (step, metrics)."""

    name = "metrics-recorder"

    def __init__(self):
        self.rows: list[tuple[int, dict[str, float]]] = []

    @ptrain.hookimpl
    def log_metrics(self, trainer, metrics, step):
        if trainer.is_global_zero:
            self.rows.append((step, dict(metrics)))

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(step, m[name]) for step, m in self.rows if name in m]


def fit(tmp_path, module, monitor=None, callbacks=(), **options):
    recorder = MetricsRecorder()
    monitor = monitor if monitor is not None else LearningRateMonitor()
    trainer = ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path / "runs"),
                             callbacks=[*QUIET, *callbacks, monitor, recorder], seed=0,
                             **{"max_epochs": 2, **options})
    trainer.fit(module)
    return trainer, recorder


def read_tensorboard(log_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


# ---------------------------------------------------------------------------------------------
# Values


def test_step_values_equal_the_schedulers_rates_in_tensorboard(tmp_path):
    """Per step, against a copy of the schedule computed with plain torch; read back from the
    TensorBoard event files the run wrote (float32 there)."""
    module = TinyRegressor(scheduler={"gamma": 0.5, "interval": "step"})
    trainer, recorder = fit(tmp_path, module, log_every_n_steps=1)
    reference = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(reference, step_size=1, gamma=0.5)
    expected = []
    for step in range(1, 2 * STEPS_PER_EPOCH + 1):
        expected.append((step, schedule.get_last_lr()[0]))  # what the step reaching it used
        reference.step()
        schedule.step()
    assert recorder.series("lr-SGD") == expected
    logged = read_tensorboard(trainer.log_dir, "lr-SGD")
    assert [s for s, _ in logged] == [s for s, _ in expected]
    assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6)
    # the last value is also in callback_metrics, and the schedule really moved the weights' LR
    assert float(trainer.callback_metrics["lr-SGD"]) == pytest.approx(expected[-1][1])


def test_step_logging_follows_log_every_n_steps(tmp_path):
    module = TinyRegressor(scheduler={"gamma": 0.9, "interval": "step"})
    _, recorder = fit(tmp_path, module, log_every_n_steps=3)
    lr = recorder.series("lr-SGD")
    assert [s for s, _ in lr] == [3, 6, 9, 12, 15]
    assert [v for _, v in lr] == pytest.approx([0.1 * 0.9 ** (s - 1) for s, _ in lr])
    # on the same steps as the module's own step metric
    loss_steps = {s for s, m in recorder.rows if "train_loss" in m}
    assert {s for s, _ in lr} <= loss_steps


def test_epoch_scheduler_logs_at_each_epoch_start(tmp_path):
    module = TinyRegressor(scheduler={"gamma": 0.5, "interval": "epoch"})
    _, recorder = fit(tmp_path, module, max_epochs=3, log_every_n_steps=1)
    assert recorder.series("lr-SGD") == [(0, 0.1), (8, 0.05), (16, 0.025)]


def test_logging_interval_step_overrides_an_epoch_scheduler(tmp_path):
    module = TinyRegressor(scheduler={"gamma": 0.5, "interval": "epoch"})
    _, recorder = fit(tmp_path, module, LearningRateMonitor(logging_interval="step"),
                      log_every_n_steps=4)
    # the rate each batch reaching the step trained with: the epoch's (the scheduler steps after
    # the epoch's last batch)
    assert recorder.series("lr-SGD") == [(4, 0.1), (8, 0.1), (12, 0.05), (16, 0.05)]


def test_logging_interval_epoch_with_a_step_scheduler(tmp_path):
    module = TinyRegressor(scheduler={"gamma": 0.5, "interval": "step"})
    _, recorder = fit(tmp_path, module, LearningRateMonitor(logging_interval="epoch"),
                      log_every_n_steps=1)
    assert recorder.series("lr-SGD") == [(0, 0.1), (8, 0.1 * 0.5 ** 8)]


def test_momentum_and_weight_decay_of_adam_param_groups(tmp_path):
    class TwoGroups(TinyRegressor):
        def configure_optimizers(self):
            return torch.optim.AdamW([{"params": [self.net[1].weight]},
                                      {"params": [self.net[1].bias], "lr": 0.01,
                                       "weight_decay": 0.0, "betas": (0.8, 0.99)}],
                                     lr=0.1, weight_decay=0.05)

    monitor = LearningRateMonitor(logging_interval="step", log_momentum=True,
                                  log_weight_decay=True)
    _, recorder = fit(tmp_path, TwoGroups(), monitor, max_epochs=1, log_every_n_steps=4)
    first = next(m for _, m in recorder.rows if "lr-AdamW/pg1" in m)
    assert first == {"lr-AdamW/pg1": 0.1, "lr-AdamW/pg1-momentum": 0.9,
                     "lr-AdamW/pg1-weight_decay": 0.05, "lr-AdamW/pg2": 0.01,
                     "lr-AdamW/pg2-momentum": 0.8, "lr-AdamW/pg2-weight_decay": 0.0}


def test_without_a_logger_it_warns_and_keeps_callback_metrics(tmp_path):
    trainer = ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path / "runs"),
                             callbacks=[*QUIET, "no:tensorboard", LearningRateMonitor()],
                             max_epochs=1)
    with pytest.warns(UserWarning, match="no logger is part of this run") as said:
        trainer.fit(TinyRegressor())
    assert float(trainer.callback_metrics["lr-SGD"]) == pytest.approx(0.1)
    # located in the plugin (the CLI names its package as the source), not in pluggy
    [where] = {w.filename for w in said if "no logger" in str(w.message)}
    assert where == sys.modules[LearningRateMonitor.__module__].__file__, where


# ---------------------------------------------------------------------------------------------
# Names, against Lightning's


def _opt_configs(parameters):
    """Optimizer setups as (name, factory(params) -> configure_optimizers result, manual), shared
    by the ptrain and the Lightning module so both frameworks see the same optimizers."""
    a, b = parameters

    def sgd_adam_groups():
        o1 = torch.optim.SGD(a, lr=0.1)
        o2 = torch.optim.SGD(b, lr=0.2, momentum=0.9)
        o3 = torch.optim.Adam([{"params": a[:1], "name": "w"}, {"params": a[1:], "name": "bias"}],
                              lr=0.3)
        return [o1, o2, o3], [{"scheduler": torch.optim.lr_scheduler.StepLR(o2, 1, 0.5),
                               "interval": "step"}]

    def named_scheduler():
        o1 = torch.optim.SGD(a, lr=0.1)
        o2 = torch.optim.SGD(b, lr=0.2)
        return [o1, o2], [{"scheduler": torch.optim.lr_scheduler.StepLR(o2, 1, 0.5),
                           "name": "custom"},
                          {"scheduler": torch.optim.lr_scheduler.StepLR(o1, 1, 0.5),
                           "interval": "step"}]

    def one_adam_two_groups():
        o = torch.optim.Adam([{"params": a}, {"params": b, "lr": 0.01}], lr=0.1)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": torch.optim.lr_scheduler.StepLR(o, 1, 0.5), "interval": "step"}}

    def three_sgd():
        return [torch.optim.SGD(a, lr=0.1), torch.optim.SGD(b, lr=0.2),
                torch.optim.SGD(a + b, lr=0.3)]

    def single_named_group():
        return torch.optim.SGD([{"params": a + b, "name": "all"}], lr=0.1)

    return {"sgd_adam_groups": (sgd_adam_groups, True),
            "named_scheduler": (named_scheduler, True),
            "one_adam_two_groups": (one_adam_two_groups, False),
            "three_sgd": (three_sgd, True),
            "single_named_group": (single_named_group, False)}


CASES = list(_opt_configs(([None], [None])))

#: What Lightning 2.6.6's LearningRateMonitor logged for each case (observed by running it with
#: log_momentum=True, log_weight_decay=True); the test also runs Lightning when it is installed.
LIGHTNING_NAMES = {
    "sgd_adam_groups": ["lr-SGD", "lr-SGD-1", "lr-Adam/w", "lr-Adam/bias"],
    "named_scheduler": ["custom", "lr-SGD"],
    "one_adam_two_groups": ["lr-Adam/pg1", "lr-Adam/pg2"],
    "three_sgd": ["lr-SGD", "lr-SGD-1", "lr-SGD-2"],
    "single_named_group": ["lr-SGD/all"],
}


def _expand(names: list[str]) -> set[str]:
    return {f"{n}{suffix}" for n in names for suffix in ("", "-momentum", "-weight_decay")}


class NamesModule(TinyRegressor):
    def __init__(self, case: str = "sgd_adam_groups"):
        super().__init__()
        self.case = case
        self.extra = nn.Linear(4, 1)
        factory, manual = _opt_configs((list(self.net.parameters()),
                                        list(self.extra.parameters())))[case]
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x) + self.extra(x), y)
        if self.automatic_optimization:
            return loss
        optimizers = self.optimizers()
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            optimizer.zero_grad()
        self.manual_backward(loss)
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            optimizer.step()
        return loss

    def configure_optimizers(self):
        factory, _ = _opt_configs((list(self.net.parameters()),
                                   list(self.extra.parameters())))[self.case]
        return factory()


def _lightning_names(case: str) -> set[str]:
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import LearningRateMonitor as LightningLRMonitor
    from lightning.pytorch.loggers.logger import Logger

    class Keys(Logger):
        name, version = "keys", 0

        def __init__(self):
            super().__init__()
            self.keys = set()

        def log_metrics(self, metrics, step=None):
            self.keys.update(k for k in metrics if k != "epoch")

        def log_hyperparams(self, *args, **kwargs):
            pass

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Dropout(0.0), nn.Linear(4, 1))
            self.extra = nn.Linear(4, 1)
            self.automatic_optimization = not _opt_configs(([None], [None]))[case][1]

        def training_step(self, batch, batch_idx):
            return _train(self, batch)

        def configure_optimizers(self):
            return _opt_configs((list(self.net.parameters()),
                                 list(self.extra.parameters())))[case][0]()

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)

    logger = Keys()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(max_epochs=1, logger=logger, log_every_n_steps=1,
                            callbacks=[LightningLRMonitor(log_momentum=True,
                                                          log_weight_decay=True)],
                            enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, accelerator="cpu")
        trainer.fit(Module())
    return logger.keys


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_names_match_lightning(tmp_path, case):
    monitor = LearningRateMonitor(log_momentum=True, log_weight_decay=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGD without momentum: the warning is tested below
        _, recorder = fit(tmp_path, NamesModule(case), monitor, max_epochs=1,
                          log_every_n_steps=1)
    ours = {k for _, m in recorder.rows for k in m if k not in ("train_loss", "val_loss")}
    assert ours == _expand(LIGHTNING_NAMES[case])
    assert ours == _lightning_names(case)


def test_log_momentum_warns_for_an_optimizer_without_momentum(tmp_path):
    class Adagrad(TinyRegressor):
        def configure_optimizers(self):
            return torch.optim.Adagrad(self.parameters(), lr=0.1)

    with pytest.warns(RuntimeWarning, match="do not have momentum: Adagrad; 0 is logged"):
        _, recorder = fit(tmp_path, Adagrad(), LearningRateMonitor(log_momentum=True),
                          max_epochs=1)
    assert recorder.series("lr-Adagrad-momentum")[0] == (0, 0.0)
    # SGD has a momentum (0 by default): no warning, as in Lightning
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _, recorder = fit(tmp_path / "sgd", TinyRegressor(), LearningRateMonitor(log_momentum=True),
                          max_epochs=1)
    assert recorder.series("lr-SGD-momentum")[0] == (0, 0.0)


# ---------------------------------------------------------------------------------------------
# Options and errors


def test_bad_logging_interval_from_python():
    with pytest.raises(ConfigError, match="'step', 'epoch' or unset"):
        LearningRateMonitor(logging_interval="batch")


def test_duplicate_param_group_names_are_refused(tmp_path):
    class Duplicates(TinyRegressor):
        def configure_optimizers(self):
            return torch.optim.SGD([{"params": [self.net[1].weight], "name": "x"},
                                    {"params": [self.net[1].bias], "name": "x"}], lr=0.1)

    with pytest.raises(ConfigError, match="same 'name' \\(x\\)"):
        fit(tmp_path, Duplicates(), max_epochs=1)


@pytest.mark.slow
def test_cli_options_and_errors(tmp_path):
    common = ["fit", "--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu",
              "--max-epochs", "1", "--no-progress-bar", "--default-root-dir", str(tmp_path),
              "-p", "learning-rate-monitor"]
    bad = run_cli(*common, "--learning-rate-monitor-logging-interval", "hourly", cwd=REPO)
    assert_usage_error(bad, "--learning-rate-monitor-logging-interval", "step, epoch")
    not_bool = run_cli(*common, "--learning-rate-monitor-log-momentum=maybe", cwd=REPO)
    assert not_bool.returncode == 2 and "Traceback" not in not_bool.stderr
    ok = run_cli(*common, "--learning-rate-monitor-logging-interval", "epoch",
                 "--log-every-n-steps", "1", cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert read_tensorboard(tmp_path / "version_0", "lr-SGD") == [(0, pytest.approx(0.1))]


@pytest.mark.slow
def test_two_rank_ddp_logs_each_step_once(tmp_path):
    """Both ranks call log_metrics; the TensorBoard logger writes on rank 0 only: one event per
    step, with the schedule's values."""
    result = run_cli("fit", "--model", "tests.conftest:TinyRegressor", "--model.scheduler",
                     '{gamma = 0.5, interval = "step"}', "--accelerator", "cpu", "--strategy",
                     "ddp", "--devices", "2", "--max-epochs", "2", "--log-every-n-steps", "2",
                     "--no-progress-bar", "-p", "no:model-summary", "-p", "learning-rate-monitor",
                     "--default-root-dir", str(tmp_path), cwd=REPO)
    assert result.returncode == 0, result.stderr
    logged = read_tensorboard(tmp_path / "version_0", "lr-SGD")
    # 64 samples over 2 ranks in batches of 8: 4 steps per epoch
    assert [s for s, _ in logged] == [2, 4, 6, 8]
    assert [v for _, v in logged] == pytest.approx([0.1 * 0.5 ** (s - 1) for s in (2, 4, 6, 8)])


# ---------------------------------------------------------------------------------------------
# What the callback keeps (lrs, last_momentum_values, last_weight_decay_values), against
# Lightning's LearningRateMonitor on the same program


def _lightning_kept(tmp_path, case: str, interval: str | None, every: int, epochs: int) -> dict:
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import LearningRateMonitor as LightningLRMonitor
    from lightning.pytorch.loggers import CSVLogger

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Dropout(0.0), nn.Linear(4, 1))
            self.extra = nn.Linear(4, 1)
            self.automatic_optimization = not KEPT_CASES[case][1]

        def training_step(self, batch, batch_idx):
            return _train(self, batch)

        def configure_optimizers(self):
            return KEPT_CASES[case][0](list(self.net.parameters()), list(self.extra.parameters()))

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(28, 4), torch.randn(28, 1)), batch_size=4)

    monitor = LightningLRMonitor(logging_interval=interval, log_momentum=True,
                                 log_weight_decay=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(max_epochs=epochs, logger=CSVLogger(str(tmp_path / "lightning")),
                            log_every_n_steps=every, callbacks=[monitor],
                            enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, accelerator="cpu")
        trainer.fit(Module())
    return {"lrs": monitor.lrs, "momentum": monitor.last_momentum_values,
            "weight_decay": monitor.last_weight_decay_values}


def _train(module, batch):
    x, y = batch
    loss = nn.functional.mse_loss(module.net(x) + module.extra(x), y)
    if module.automatic_optimization:
        return loss
    optimizers = module.optimizers()
    for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
        optimizer.zero_grad()
    module.manual_backward(loss)
    for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
        optimizer.step()
    return None


def _two_adams(a, b):
    o1, o2 = torch.optim.Adam(a, lr=0.1), torch.optim.Adam(b, lr=0.2, weight_decay=0.01)
    return [o1, o2], [torch.optim.lr_scheduler.StepLR(o1, 1, 0.5),
                      {"scheduler": torch.optim.lr_scheduler.StepLR(o2, 1, 0.9),
                       "interval": "step"}]


def _step_schedule(a, b):
    o = torch.optim.SGD([{"params": a}, {"params": b, "lr": 0.01}], lr=0.1, momentum=0.5)
    return {"optimizer": o, "lr_scheduler": {
        "scheduler": torch.optim.lr_scheduler.StepLR(o, 1, 0.8), "interval": "step"}}


#: name -> (configure_optimizers(params_a, params_b), manual optimization)
KEPT_CASES = {"two_adams_manual": (_two_adams, True), "step_schedule": (_step_schedule, False)}


class KeptModule(ptrain.TrainModule):
    def __init__(self, case):
        super().__init__()
        self.case = case
        self.net = nn.Sequential(nn.Dropout(0.0), nn.Linear(4, 1))
        self.extra = nn.Linear(4, 1)
        self.automatic_optimization = not KEPT_CASES[case][1]

    def training_step(self, batch, batch_idx):
        return _train(self, batch)

    def configure_optimizers(self):
        return KEPT_CASES[self.case][0](list(self.net.parameters()),
                                        list(self.extra.parameters()))

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(28, 4), torch.randn(28, 1)), batch_size=4)


@pytest.mark.parametrize("interval", [None, "step", "epoch"])
@pytest.mark.parametrize("case", list(KEPT_CASES))
def test_kept_values_match_lightning(tmp_path, case, interval):
    """7 batches an epoch, log_every_n_steps=2: Lightning counts batches that stepped (the manual
    module steps two optimizers per batch) and logs the rates each such batch trains with."""
    monitor = LearningRateMonitor(logging_interval=interval, log_momentum=True,
                                  log_weight_decay=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(tmp_path, KeptModule(case), monitor, log_every_n_steps=2, max_epochs=2)
    expected = _lightning_kept(tmp_path, case, interval, every=2, epochs=2)
    assert list(monitor.lrs) == list(expected["lrs"])
    for name, values in expected["lrs"].items():
        assert monitor.lrs[name] == pytest.approx(values), name
    assert monitor.last_momentum_values == pytest.approx(expected["momentum"])
    assert monitor.last_weight_decay_values == pytest.approx(expected["weight_decay"])


def test_a_param_group_added_in_training_gets_its_own_history(tmp_path):
    """A finetuning callback adds a group to the only one at the second epoch's start: ``lr-SGD``
    becomes ``lr-SGD/pg1`` with its history, beside the new ``lr-SGD/pg2`` (Lightning's keys)."""

    class AddGroup:
        @ptrain.hookimpl(tryfirst=True)
        def on_epoch_start(self, trainer):
            if trainer.current_epoch == 1:
                trainer.optimizers[0].add_param_group({"params": [module.extra], "lr": 0.5})

    class WithExtra(TinyRegressor):
        def __init__(self):
            super().__init__()
            self.extra = nn.Parameter(torch.zeros(1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.net.parameters(), lr=0.1)

    module = WithExtra()
    monitor = LearningRateMonitor(logging_interval="epoch")
    fit(tmp_path, module, monitor, callbacks=[AddGroup()], max_epochs=3)
    assert monitor.lrs == {"lr-SGD/pg1": [0.1, 0.1, 0.1], "lr-SGD/pg2": [0.5, 0.5]}
