"""A model for the multi-node tests (tests/test_two_nodes.py): it says which node each rank
ran on and what it computed, so that a job across machines can be compared with one machine's.

Every training step appends ``{"step", "loss"}`` (a JSON line) to ``<record_dir>/rank<R>.jsonl``;
the first line is ``{"node": host name, "shard_group": [ranks]}``, the ranks whose shards make
one replica (``None`` without a device mesh). ``step_s`` makes each step take that long (a job
long enough to lose a node in). ``restart_delay_s`` holds back a process of a restarted torchrun
try (``TORCHELASTIC_RESTART_COUNT`` above 0) that long before it meets the others, so that they
reach the store first and find there what the previous try left. ``fail_rank`` raises an
error in its training step ``fail_at_step``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import torch.distributed as dist
from torch import nn

from tests.conftest import TinyRegressor


class NodeRecorder(TinyRegressor):
    def __init__(self, record_dir: str, step_s: float = 0.0, n: int = 64,
                 restart_delay_s: float = 0.0, fail_rank: int = -1, fail_at_step: int = -1,
                 **kwargs):
        super().__init__(n=n, **kwargs)
        self.record_dir, self.step_s = record_dir, step_s
        self.fail_rank, self.fail_at_step = fail_rank, fail_at_step
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
            time.sleep(restart_delay_s)

    def _write(self, line: dict) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        with open(Path(self.record_dir) / f"rank{rank}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    def on_fit_start(self):
        mesh = self.trainer.device_mesh
        group = None
        if mesh is not None and "dp_shard" in (mesh.mesh_dim_names or ()):
            group = dist.get_process_group_ranks(mesh.get_group("dp_shard"))
        self._write({"node": socket.gethostname(), "shard_group": group})

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self._write({"step": self.trainer.global_step, "loss": float(loss.detach())})
        if self.trainer.global_step == self.fail_at_step \
                and self.trainer.global_rank == self.fail_rank:
            raise ValueError(f"the recorder's planned failure at step {self.fail_at_step}")
        if self.step_s:
            time.sleep(self.step_s)
        self.log("train_loss", loss)
        return loss


def read(record_dir: Path) -> dict[int, dict]:
    """What :class:`NodeRecorder` wrote: rank -> ``{"node", "shard_group", "losses", "steps"}``
    (the first line's node and shard group; every training step's loss and global step, of
    every attempt of a restarted job in order)."""
    ranks = {}
    for path in sorted(Path(record_dir).glob("rank*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        head = lines[0] if lines and "node" in lines[0] else {}
        ranks[int(path.stem[len("rank"):])] = {
            "node": head.get("node"), "shard_group": head.get("shard_group"),
            "losses": [line["loss"] for line in lines if "loss" in line],
            "steps": [line["step"] for line in lines if "loss" in line]}
    return ranks


__all__ = ["NodeRecorder", "read"]
