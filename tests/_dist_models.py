"""Modules and plugins for the multi-process strategy tests.

They live in a module of their own (imported as ``tests._dist_models``) because worker processes
unpickle them: a class defined inside a test function can't travel to a spawned process. The CLI
tests name them as ``--model tests._dist_models:NAME`` (the CLI runs from the repository root).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

import ptrain
from tests.conftest import TinyRegressor


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class RankRecorder(TinyRegressor):
    """TinyRegressor whose training samples carry their index. Every training step appends
    ``{"epoch", "batch_idx", "indices"}`` (a JSON line) to ``<record_dir>/rank<R>.jsonl``, and
    the module logs its own rank as an epoch-level metric (``rank``; ``val_rank`` in
    validation), which differs per process, so only a reduction makes the ranks agree on it."""

    def __init__(self, record_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.record_dir = record_dir
        x, y = self.train_set.tensors
        self.train_set = TensorDataset(x, y, torch.arange(len(x)))

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        rank = _rank()
        with open(Path(self.record_dir) / f"rank{rank}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"epoch": self.trainer.current_epoch, "batch_idx": batch_idx,
                                "indices": index.tolist()}) + "\n")
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        self.log("rank", float(rank), on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("val_rank", float(_rank()))


def read_records(record_dir: Path) -> dict[int, list[dict]]:
    """What :class:`RankRecorder` wrote: rank -> its JSON lines in order."""
    records = {}
    for path in sorted(Path(record_dir).glob("rank*.jsonl")):
        rank = int(path.stem[len("rank"):])
        records[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return records


class WideRegressor(TinyRegressor):
    """TinyRegressor with two hidden layers of ``width`` units and dropout between them: each
    optimizer step updates a few hundred thousand numbers, so anything the ranks wrongly share
    or race on shows in the result."""

    def __init__(self, width: int = 512, dropout: float = 0.25, **kwargs):
        super().__init__(dropout=dropout, **kwargs)
        self.net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(width, 1))


class FailingRegressor(TinyRegressor):
    """TinyRegressor whose ``training_step`` raises ``RuntimeError(message)`` on ``fail_rank``
    at ``fail_batch`` of the first epoch; the other ranks go on into the gradient all-reduce,
    where they would wait for the failed rank until the collective timeout."""

    def __init__(self, fail_rank: int = 1, fail_batch: int = 2,
                 message: str = "deliberate failure in training_step", **kwargs):
        super().__init__(**kwargs)
        self.fail_rank, self.fail_batch, self.message = fail_rank, fail_batch, message

    def training_step(self, batch, batch_idx):
        if (_rank() == self.fail_rank and batch_idx == self.fail_batch
                and self.trainer.current_epoch == 0):
            raise RuntimeError(self.message)
        return super().training_step(batch, batch_idx)


class StartMethodRecorder(TinyRegressor):
    """Writes, on each rank, the multiprocessing start method its DataLoader workers would be
    started with, into ``folder/rank<R>.txt``."""

    def __init__(self, folder: str, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def on_fit_start(self):
        Path(self.folder, f"rank{_rank()}.txt").write_text(multiprocessing.get_start_method())


class RandomDraws(torch.utils.data.Dataset):
    """Each item is a fresh draw of torch's, NumPy's and Python's generators (what a random
    augmentation draws), made in the DataLoader worker that loads it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        import random

        import numpy as np

        return torch.tensor([torch.rand(()).item(), float(np.random.rand()), random.random()])


class DrawRecorder(TinyRegressor):
    """Trains on :class:`RandomDraws` loaded by one DataLoader worker; writes each rank's
    draws, in the order its steps see them, to ``folder/draws<R>.json``."""

    def __init__(self, folder: str, **kwargs):
        super().__init__(**kwargs)
        self.folder, self.net = folder, nn.Linear(3, 1)
        self.draws: list[list[float]] = []

    def train_dataloader(self):
        return DataLoader(RandomDraws(), batch_size=2, num_workers=1)

    def val_dataloader(self):
        return None

    def training_step(self, batch, batch_idx):
        self.draws += batch.tolist()
        return self.net(batch).pow(2).mean()

    def on_fit_end(self):
        Path(self.folder, f"draws{_rank()}.json").write_text(json.dumps(self.draws))


class RankOwnNames(TinyRegressor):
    """Logs a name of its rank's own (``a`` on rank 0, ``b`` and, reduced by max, ``c`` on rank
    1: a value per class seen, a branch on the rank) and ``both`` everywhere (10 x (rank + 1));
    writes each rank's callback_metrics to ``folder/metrics<R>.json``."""

    def __init__(self, folder: str, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def training_step(self, batch, batch_idx):
        if _rank() == 0:
            self.log("a", 1.0)
        else:
            self.log("b", 100.0)
            self.log("c", 7.0, reduce_fx="max")
        self.log("both", 10.0 * (_rank() + 1))
        return super().training_step(batch, batch_idx)

    def on_fit_end(self):
        seen = {k: float(v) for k, v in self.trainer.callback_metrics.items()
                if k in ("a", "b", "c", "both")}
        Path(self.folder, f"metrics{_rank()}.json").write_text(json.dumps(seen))


class ThreadRecorder(TinyRegressor):
    """Writes each rank's intra-op thread count at the start of fit to ``folder/threads<R>``."""

    def __init__(self, folder: str, **kwargs):
        super().__init__(**kwargs)
        self.folder = folder

    def on_fit_start(self):
        Path(self.folder, f"threads{_rank()}").write_text(str(torch.get_num_threads()))


class OwnSamplerRegressor(TinyRegressor):
    """TinyRegressor whose training dataloader has a sampler of its own (not a Random- or
    SequentialSampler), which a multi-process strategy can't shard for it. ``slow_rank`` makes
    its dataloader ``delay_s`` seconds late on that rank, so that the other ranks fail first."""

    def __init__(self, slow_rank: int = -1, delay_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.slow_rank, self.delay_s = slow_rank, delay_s

    def train_dataloader(self):
        if _rank() == self.slow_rank:
            time.sleep(self.delay_s)
        return DataLoader(self.train_set, batch_size=self.batch_size,
                          sampler=SubsetRandomSampler(range(len(self.train_set))))


class GroupKiller:
    """A callback plugin object that SIGKILLs the whole process group (the launching process,
    the elastic agent in it and every worker) from global rank 0 the first time ``global_step``
    reaches ``step``; ``trylast`` so that the checkpoint callback (and its barrier) had its turn
    at that batch."""

    name = "group-killer"

    def __init__(self, step: int | None):
        self.step = step

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer, batch_idx):
        if self.step is not None and trainer.is_global_zero and trainer.global_step == self.step:
            sys.stdout.flush()
            os.killpg(os.getpgid(0), signal.SIGKILL)


class StopOnOneRank:
    """A callback plugin object that asks to stop on global rank ``rank`` only: at the end of
    epoch ``epoch``, or with ``step`` in ``on_train_batch_end`` once ``global_step`` reaches it.
    The others must follow (the decision is agreed), or they would wait for it in the next
    collectives."""

    name = "stop-on-one-rank"

    def __init__(self, rank: int, epoch: int | None = None, step: int | None = None):
        self.rank, self.epoch, self.step = rank, epoch, step

    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        if trainer.global_rank == self.rank and trainer.current_epoch == self.epoch:
            trainer.should_stop = True

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            trainer.should_stop = True


class NaNOnOneRank(TinyRegressor):
    """TinyRegressor whose loss becomes NaN on ``rank`` at ``batch`` of the first epoch."""

    def __init__(self, rank: int = 1, batch: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.nan_rank, self.nan_batch = rank, batch

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if (_rank() == self.nan_rank and batch_idx == self.nan_batch
                and self.trainer.current_epoch == 0):
            loss = loss * float("nan")
        return loss
