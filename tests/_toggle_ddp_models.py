"""A two-part manually-optimized module and a counting DDP comm hook, for the tests of the
``toggling`` plugin under multi-process strategies (``tests/plugins/callbacks/
test_toggling_ddp.py``).

They live in a module of their own because worker processes unpickle them: a class defined
inside a test function can't travel to a spawned process.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import ptrain
from ptrain_toggling import toggle_model

#: batches over which the generator accumulates its gradient before it steps
G_WINDOW = 2


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _counting_allreduce(state, bucket):
    """torch's own default all-reduce hook (sum, then divide by the world size), counted.
    (No annotations: DDP checks real ones, and this file's are strings.)"""
    state.calls += 1
    return default_hooks.allreduce_hook(None, bucket)


class CommCounter:
    """A callback plugin object: at ``setup`` it registers :func:`_counting_allreduce` as the
    DDP model's comm hook, so ``calls`` counts the gradient buckets DDP all-reduced in this
    process. Under one process there is no DDP model and ``calls`` stays 0."""

    name = "comm-counter"

    def __init__(self) -> None:
        self.calls = 0
        self.registered = False

    @ptrain.hookimpl
    def setup(self, trainer, stage: str) -> None:
        if stage == "fit" and isinstance(trainer.model, DistributedDataParallel):
            trainer.model.register_comm_hook(self, _counting_allreduce)
            self.registered = True


class ToggleGAN(ptrain.TrainModule):
    """A GAN-shaped module (no dropout, no batchnorm): ``generator`` maps the noise ``z`` to a
    sample, ``discriminator`` scores samples. The noise is part of each dataset row
    ``(real, z)``, so a row gets the same noise however the rows are split into batches or
    processes.

    Each batch: the generator accumulates over :data:`G_WINDOW` batches:
    ``toggle_model(opt_g, sync_grad=False)`` for the window's first batch (backward only),
    ``sync_grad=True`` for its last (backward, step); then the discriminator steps
    (``toggle_model(opt_d)``, synchronised).

    With ``record_dir``, every backward appends a JSON line to ``<record_dir>/rank<R>.jsonl``:
    epoch, batch_idx, part (``"d"``/``"g"``), sync (the ``sync_grad`` of its toggle), the comm
    hook's count before and after it (``None`` without a :class:`CommCounter`), and the
    gradient of the part trained, flattened, right after it."""

    automatic_optimization = False

    def __init__(self, record_dir: str | None = None, n: int = 64, batch_size: int = 8,
                 features: int = 4, latent: int = 3, hidden: int = 8, lr: float = 0.5,
                 seed: int = 0):
        super().__init__()
        self.record_dir, self.batch_size, self.lr = record_dir, batch_size, lr
        self.generator = nn.Sequential(nn.Linear(latent, hidden), nn.Tanh(),
                                       nn.Linear(hidden, features))
        self.discriminator = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(),
                                           nn.Linear(hidden, 1))
        g = torch.Generator().manual_seed(seed)
        real = 0.5 * torch.randn(n, features, generator=g) + 1.0
        z = torch.randn(n, latent, generator=g)
        self.train_set = TensorDataset(real, z)

    # the two losses (batch means), shared with the tests' plain-torch reference

    def d_loss(self, real: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        real_logits = self.discriminator(real)
        fake_logits = self.discriminator(self.generator(z))
        return (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
                + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))

    def g_loss(self, z: torch.Tensor) -> torch.Tensor:
        logits = self.discriminator(self.generator(z))
        return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits)) / G_WINDOW

    def _counter(self) -> CommCounter | None:
        return next((p for p in self.trainer.plugins.values() if isinstance(p, CommCounter)),
                    None)

    def _backward(self, loss: torch.Tensor, part: nn.Module, name: str, sync: bool) -> None:
        counter = self._counter()
        before = counter.calls if counter is not None else None
        self.manual_backward(loss)
        after = counter.calls if counter is not None else None
        if self.record_dir is None:
            return
        grad = torch.cat([p.grad.detach().flatten() for p in part.parameters()])
        record = {"epoch": self.trainer.current_epoch, "batch_idx": self.trainer.batch_idx,
                  "part": name, "sync": sync, "before": before, "after": after,
                  "hook_registered": counter is not None and counter.registered,
                  "grad": grad.tolist()}
        path = Path(self.record_dir) / f"rank{_rank()}.jsonl"
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def training_step(self, batch, batch_idx):
        real, z = batch
        opt_g, opt_d = self.optimizers()
        last_of_window = (batch_idx + 1) % G_WINDOW == 0
        # the generator first: a window's first backward is then also the first of its batch,
        # right after the previous batch's forward (where DDP must not have armed its reducer)
        with toggle_model(opt_g, sync_grad=last_of_window):
            g_loss = self.g_loss(z)
            self._backward(g_loss, self.generator, "g", sync=last_of_window)
            if last_of_window:
                opt_g.step()
                opt_g.zero_grad()
        with toggle_model(opt_d):
            d_loss = self.d_loss(real, z)
            self._backward(d_loss, self.discriminator, "d", sync=True)
            opt_d.step()
            opt_d.zero_grad()
        self.log("d_loss", d_loss.detach())
        return g_loss.detach()

    def configure_optimizers(self):
        return [torch.optim.SGD(self.generator.parameters(), lr=self.lr),
                torch.optim.SGD(self.discriminator.parameters(), lr=self.lr)]

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=False)


def read_backward_records(record_dir: Path) -> dict[int, list[dict]]:
    """What :class:`ToggleGAN` wrote: rank -> its records in order."""
    records = {}
    for path in sorted(Path(record_dir).glob("rank*.jsonl")):
        rank = int(path.stem[len("rank"):])
        records[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return records
