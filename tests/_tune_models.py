"""Models and test plugins for ``ptrain tune`` (tests/test_tune.py); the CLI runs import them as
``tests._tune_models:NAME`` from the repository root."""

from __future__ import annotations

import time

from torch.utils.data import DataLoader, Dataset, get_worker_info

from ptrain import hookimpl
from ptrain.catalog import Catalog, PluginInfo
from ptrain.tuning import Candidate
from tests.conftest import TinyRegressor, make_regression_data


class SlowItems(Dataset):
    """Regression items that each take ``ms`` milliseconds to fetch (as a decoded image from
    disk would): the wait is a sleep, so worker processes overlap it even on 2 cores."""

    def __init__(self, n: int, ms: float):
        self.data = make_regression_data(n, seed=0)
        self.ms = ms

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        time.sleep(self.ms / 1000)
        return self.data[index]


class SlowDataRegressor(TinyRegressor):
    """TinyRegressor whose training items are slow to fetch, and that has no validation."""

    def __init__(self, ms: float = 3.0, n: int = 64, batch_size: int = 8):
        super().__init__(n=n, batch_size=batch_size, with_val=False)
        self.slow = SlowItems(n, ms)

    def train_dataloader(self):
        return DataLoader(self.slow, batch_size=self.batch_size)

    def val_dataloader(self):
        return None


class WorkerSlowItems(SlowItems):
    """Regression items fetched at once in the main process, and ``ms`` milliseconds each in a
    loader worker: a candidate with workers runs far longer than the user's configuration."""

    def __getitem__(self, index: int):
        if get_worker_info() is not None:
            time.sleep(self.ms / 1000)
        return self.data[index]


class SlowInWorkersRegressor(SlowDataRegressor):
    """SlowDataRegressor whose items are slow only in loader workers (see WorkerSlowItems)."""

    def __init__(self, ms: float = 500.0, n: int = 128, batch_size: int = 2):
        super().__init__(ms=ms, n=n, batch_size=batch_size)
        self.slow = WorkerSlowItems(n, ms)


class WorkerSlowRegressor(SlowInWorkersRegressor):
    """SlowInWorkersRegressor with items only slow enough (30 ms in a worker) that every loader
    candidate finishes its trials and loses, by far: a tune whose verdict is always "no measured
    candidate beat your configuration"."""

    def __init__(self, ms: float = 30.0, n: int = 128, batch_size: int = 2):
        super().__init__(ms=ms, n=n, batch_size=batch_size)


class SmallBatchRegressor(TinyRegressor):
    """A near-zero model on batches of 2: the step's fixed cost dominates, so a larger batch
    trains many more samples per second."""

    def __init__(self, n: int = 512, batch_size: int = 2):
        super().__init__(n=n, batch_size=batch_size, with_val=False)

    def val_dataloader(self):
        return None


class CtrlCInATrial(TinyRegressor):
    """Sends its own process SIGINT at the third step of the first trial, as a user's Ctrl-C
    during the tune would arrive."""

    sent = False

    def training_step(self, batch, batch_idx):
        if batch_idx == 2 and not CtrlCInATrial.sent:
            CtrlCInATrial.sent = True
            import os
            import signal

            os.kill(os.getpid(), signal.SIGINT)
        return super().training_step(batch, batch_idx)


class FailingRegressor(TinyRegressor):
    """Its training_step fails: a baseline that can't be measured."""

    def training_step(self, batch, batch_idx):
        raise RuntimeError("this model's training_step is broken on purpose")


def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("this compile backend fails on purpose")


class FailingCompileOffer:
    """A plugin that offers compiling with a backend that fails (a failed candidate)."""

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        from torch._dynamo import list_backends, register_backend

        if "ptrain-test-failing" not in list_backends(exclude_tags=None):
            register_backend(_failing_backend, name="ptrain-test-failing")
        return [Candidate("compile (failing backend)", "failing-compile",
                          callbacks=("compile",),
                          plugin_options={"compile": {"backend": "ptrain-test-failing"}})]


class NoOpOffer:
    """A plugin that offers a change that cannot change the speed (a gain within the noise)."""

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        return [Candidate("no-op setting", "no-op",
                          plugin_options={"dataloading": {"cheap_batch_ms": 2.5}})]


def catalog_with(*names: str) -> Catalog:
    """The installed catalog plus this module's offering plugins ``names`` (as callbacks)."""
    installed = Catalog.discover()
    extra = {"failing-compile": "FailingCompileOffer", "no-op-offer": "NoOpOffer"}
    infos = [PluginInfo("callback", name, f"tests._tune_models:{extra[name]}", "ptrain-tests",
                        "0") for name in names]
    return Catalog([*installed.infos, *infos])


__all__ = ["FailingCompileOffer", "FailingRegressor", "NoOpOffer", "SlowDataRegressor",
           "SlowInWorkersRegressor", "SmallBatchRegressor", "WorkerSlowItems", "WorkerSlowRegressor",
           "catalog_with"]