"""Models and probe plugins for ``tests/plugins/strategies/test_sharding.py``.

They live in a module of their own (importable as ``_shard_models`` or ``tests._shard_models``)
because the sharding strategies pickle the module and the plugin objects to worker processes
started with ``spawn``, which import them by name; a class defined inside a test function could
not be found there.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain
from ptrain.distributed import held_bytes


class Block(nn.Module):
    """A residual ``x + tanh(Linear(x))`` block: the unit ``wrap_classes=auto`` shards (it is
    repeated in an ``nn.ModuleList``)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.forward_calls = 0  # counts recomputations too (activation checkpointing)

    def forward(self, x):
        self.forward_calls += 1
        return x + torch.tanh(self.linear(x))


def make_data(n: int, features: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g) / math.sqrt(features)
    y = torch.sin(3 * (x @ w)) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class ShardNet(ptrain.TrainModule):
    """``Linear(features, width)``, ``depth`` residual :class:`Block` s of ``width x width`` in an
    ``nn.ModuleList``, then ``Linear(width, 1)``; mean squared error on made-up data.

    The initial weights come from ``init_seed`` alone (not from the global generator), so every
    run built with the same arguments starts from the same point. With the defaults (width 256,
    depth 4) the four 256x256 weights are ~94% of the parameters: FSDP's per-tensor padding and
    ZeroRedundancyOptimizer's whole-parameter partitioning stay small next to them.
    """

    def __init__(self, width: int = 256, depth: int = 4, features: int = 32, n: int = 64,
                 batch_size: int = 8, lr: float = 0.05, momentum: float = 0.9,
                 optimizer: str = "sgd", shuffle: bool = True, dropout: float = 0.0,
                 scheduler_gamma: float | None = None, init_seed: int = 0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(init_seed)
            self.inp = nn.Linear(features, width)
            self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
            self.drop = nn.Dropout(dropout)
            self.head = nn.Linear(width, 1)
        self.batch_size, self.lr, self.momentum = batch_size, lr, momentum
        self.optimizer_name, self.shuffle = optimizer, shuffle
        self.scheduler_gamma = scheduler_gamma
        self.train_set = make_data(n, features, seed=0)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.drop(h))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
        if self.scheduler_gamma is None:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.scheduler_gamma)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle)


class ValidatedShardNet(ShardNet):
    """:class:`ShardNet` with a validation over its training data, in order."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def val_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size)


class RunProbe:
    """Records, on every rank, :func:`ptrain.distributed.held_bytes` at each
    ``on_before_optimizer_step`` (gradients complete, state of the steps before present) and
    writes them, with the number of :class:`Block` forward calls, to ``<out_dir>/rank<R>.json``
    at teardown."""

    name = "run-probe"

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.records: list[dict[str, int]] = []
        self.shared: list[bool] = []

    @ptrain.hookimpl
    def setup(self, trainer):
        # whether this rank's parameters live in shared memory (another process may write them)
        self.shared = [p.is_shared() for p in trainer.module.parameters()]

    @ptrain.hookimpl
    def on_before_optimizer_step(self, trainer):
        self.records.append(held_bytes(trainer.module, trainer.optimizers))

    @ptrain.hookimpl
    def teardown(self, trainer):
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(self.out_dir) / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps({"world_size": trainer.world_size,
                                    "global_step": trainer.global_step,
                                    "records": self.records,
                                    "parameters_shared": self.shared,
                                    "block_forward_calls": [
                                        m.forward_calls for m in trainer.module.modules()
                                        if isinstance(m, Block)]}))


class FullOptimizerStateProbe:
    """At the end of a successful fit, gathers the whole optimizer state keyed by parameter
    name (``torch.distributed.checkpoint.state_dict``, a collective: every rank takes part) and
    rank 0 writes it with ``torch.save`` to ``path``."""

    name = "full-optimizer-state-probe"

    def __init__(self, path: str):
        self.path = path

    @ptrain.hookimpl
    def teardown(self, trainer, stage):
        if stage != "fit" or trainer.exception is not None:
            return
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_optimizer_state_dict)
        state = get_optimizer_state_dict(
            trainer.module, trainer.optimizers[0],
            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if trainer.is_global_zero:
            torch.save({"optimizer": state, "global_step": trainer.global_step}, self.path)


class KillJob:
    """On global rank 0, SIGKILLs the whole process group (the launching process and every
    worker) in ``on_train_batch_end`` once ``global_step`` reaches ``step``; ``trylast`` so the
    checkpoint callback has written what it writes at that batch."""

    name = "kill-job"

    def __init__(self, step: int):
        self.step = step

    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer):
        if trainer.is_global_zero and trainer.global_step == self.step:
            sys.stdout.flush()
            os.killpg(os.getpgrp(), signal.SIGKILL)


class SetupProbe:
    """Snapshots, in ``setup`` (after a checkpoint was restored), the module's parameters, the
    first optimizer's state and the global step; in the process it runs in (single-device)."""

    name = "setup-probe"

    def __init__(self):
        self.params: dict[str, torch.Tensor] | None = None
        self.optimizer: dict | None = None
        self.global_step: int | None = None

    @ptrain.hookimpl
    def setup(self, trainer, stage):
        self.params = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}
        state = trainer.optimizers[0].state_dict()
        self.optimizer = {"state": {i: {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                        for k, v in s.items()}
                                    for i, s in state["state"].items()},
                          "param_groups": state["param_groups"]}
        self.global_step = trainer.global_step
