"""Modules, callbacks and a subprocess entry point for the finder tests (``test_finders.py``).

They live in a module of their own because worker processes of the 2-rank tests unpickle them,
and because the out-of-memory test runs a whole fit in a subprocess whose address space is
capped (``python -m tests._finder_models oom ...``): the cap can't be lifted again, so it must
not be set in the pytest process.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ptrain
from ptrain.loading import call_per_plugin
from tests.conftest import TinyRegressor

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]


class MemoryHungry(ptrain.TrainModule):
    """A regressor whose activation memory grows linearly with the batch and whose compute is
    small: each sample's 16 features are spread over a (16, ``width``) grid by a broadcast
    product with a weight, so a batch of B holds a few B x 16 x ``width`` float32 tensors
    (forward outputs kept for backward, and their gradients): 256 KiB each per sample at the
    default width, next to 256 KiB of parameters in all."""

    def __init__(self, n: int = 4096, width: int = 4096, batch_size: int = 16,
                 lr: float = 1e-3, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.grid = nn.Parameter(torch.randn(1, 16, width, generator=g) * 0.1)
        self.head = nn.Linear(16, 1)
        x = torch.randn(n, 16, generator=g)
        self.train_set = TensorDataset(x, x.sum(dim=1, keepdim=True))
        self.batch_size, self.lr = batch_size, lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        spread = torch.relu(x.unsqueeze(2) * self.grid)  # (B, 16, width)
        loss = nn.functional.mse_loss(self.head(spread.mean(dim=2)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)


class BatchSizeRecorder:
    """A callback plugin object that appends the size of every training batch of the run (not
    of the finder's trials: it sees only the loop's ``on_train_batch_end``) to ``sizes``, and
    writes them as JSON to ``<path>.rank<R>`` at teardown when ``path`` is given."""

    name = "batch-size-recorder"

    def __init__(self, path: str | None = None):
        self.path = path
        self.sizes: list[int] = []

    @ptrain.hookimpl
    def on_train_batch_end(self, batch):
        self.sizes.append(len(batch[0]))

    @ptrain.hookimpl
    def teardown(self, trainer):
        if self.path is not None:
            Path(f"{self.path}.rank{trainer.global_rank}").write_text(json.dumps(self.sizes))


class FinderProbe:
    """A callback plugin object that writes, per rank, what the finders found and what the run
    then trained with, to ``<folder>/probe.rank<R>.json``: the lr-finder's curve and suggestion,
    the batch-size-finder's trials and result, the first param group's learning rate at the
    start of the first epoch and the size of the first training batch."""

    name = "finder-probe"

    def __init__(self, folder: str):
        self.folder = folder
        self.record: dict = {}

    @ptrain.hookimpl
    def on_epoch_start(self, trainer):
        if trainer.current_epoch == 0:
            self.record["lr_at_start"] = trainer.optimizers[0].param_groups[0]["lr"]

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx):
        if trainer.current_epoch == 0 and batch_idx == 0:
            self.record["first_batch_size"] = len(batch[0])

    @ptrain.hookimpl
    def teardown(self, trainer):
        lr_finder = trainer.plugins.get("lr-finder")
        if lr_finder is not None:
            self.record.update(lrs=lr_finder.lrs, losses=lr_finder.losses,
                               smoothed=lr_finder.smoothed, suggestion=lr_finder.suggestion)
        bs_finder = trainer.plugins.get("batch-size-finder")
        if bs_finder is not None:
            self.record.update(trials=bs_finder.trials, found=bs_finder.found,
                               batch_size=bs_finder.batch_size)
        self.record["world_size"] = trainer.world_size
        path = Path(self.folder) / f"probe.rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.record))


def read_probes(folder: Path) -> dict[int, dict]:
    return {int(p.name.split(".rank")[1].split(".")[0]): json.loads(p.read_text())
            for p in sorted(Path(folder).glob("probe.rank*.json"))}


class ManualRegressor(TinyRegressor):
    """TinyRegressor that optimizes manually (one backward and one step per batch)."""

    automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.manual_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss


class ManualScheduledRegressor(ManualRegressor):
    """ManualRegressor that steps its own StepLR (which halves the rate every step) in
    ``training_step``, before its optimizer step, as some programs do."""

    def training_step(self, batch, batch_idx):
        self.lr_schedulers().step()
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=1, gamma=0.5)}


class ManualNoLoss(ManualRegressor):
    """ManualRegressor whose ``training_step`` returns nothing."""

    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)


class TwoGroupRegressor(TinyRegressor):
    """TinyRegressor with two layers in two param groups, the second at a tenth of the first's
    learning rate (SGD with momentum)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def configure_optimizers(self):
        return torch.optim.SGD([{"params": self.net[0].parameters()},
                                {"params": self.net[2].parameters(), "lr": self.lr / 10}],
                               lr=self.lr, momentum=0.9)


class GroupLRRecorder:
    """A callback plugin object that records every param group's learning rate at each
    optimizer step (``on_before_optimizer_step``: a step hook, which the finders' steps fire
    too)."""

    name = "group-lr-recorder"

    def __init__(self):
        self.steps: list[list[float]] = []

    @ptrain.hookimpl
    def on_before_optimizer_step(self, optimizer):
        self.steps.append([float(g["lr"]) for g in optimizer.param_groups])


class FlatLoss(TinyRegressor):
    """TinyRegressor whose loss does not depend on the data and stays constant whatever the
    learning rate (its weights enter it multiplied by 0)."""

    def training_step(self, batch, batch_idx):
        return 1.0 + 0.0 * sum(p.sum() for p in self.parameters())


class OwnGeneratorRegressor(TinyRegressor):
    """TinyRegressor whose training loader shuffles with a generator of its own."""

    def __init__(self, **kwargs):
        super().__init__(shuffle=True, **kwargs)
        self.generator = torch.Generator().manual_seed(1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                          generator=self.generator)


class SizeRecordingRegressor(TinyRegressor):
    """TinyRegressor that appends the size of every batch its ``training_step`` sees (the
    finders' steps included) to ``sizes``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sizes: list[int] = []

    def training_step(self, batch, batch_idx):
        self.sizes.append(len(batch[0]))
        return super().training_step(batch, batch_idx)


class CapAddressSpace:
    """A callback plugin object that caps the address space of global rank ``rank`` alone, in
    its ``setup`` (before the finders' search), at what it uses then plus ``budget_mib``."""

    name = "cap-address-space"

    def __init__(self, rank: int, budget_mib: int):
        self.rank, self.budget_mib = rank, budget_mib

    @ptrain.hookimpl
    def setup(self, trainer, stage):
        if stage == "fit" and trainer.global_rank == self.rank:
            torch.set_num_threads(1)
            limit = address_space_bytes() + self.budget_mib * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


# -- the training state, to compare before and after a search --------------------------------


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A plain copy of ``tensor`` (this rank's shard of a DTensor)."""
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.detach().clone()


def training_state(trainer) -> dict:
    """Everything a finder must leave as it found it, flattened to ``name -> value`` (tensors
    copied; a DTensor as its local shard): the module's parameters, buffers and gradients, every
    optimizer's state and param-group settings (a ZeroRedundancyOptimizer's inner one too),
    the schedulers' states, the random generators, the trainer's counters and metrics, and the
    state each plugin would checkpoint. Learning-rate entries are named ``...lr`` so that a
    test can set them apart."""
    state: dict = {}
    module = trainer.module
    params = list(module.parameters())
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        state[f"module.{name}"] = _local(tensor)
    for name, param in module.named_parameters():
        state[f"grad.{name}"] = None if param.grad is None else _local(param.grad)
    for i, optimizer in enumerate(trainer.optimizers):
        inner = getattr(optimizer, "optim", None)
        for kind, opt in (("outer", optimizer), ("inner", inner)):
            if not isinstance(opt, torch.optim.Optimizer):
                continue
            for param, per_param in opt.state.items():
                index = next(j for j, p in enumerate(params) if p is param)
                for key, value in per_param.items():
                    state[f"opt{i}.{kind}.state.{index}.{key}"] = (
                        _local(value) if isinstance(value, torch.Tensor) else value)
            for g, group in enumerate(opt.param_groups):
                for key, value in group.items():
                    if key != "params":
                        state[f"opt{i}.{kind}.group{g}.{key}"] = value
    for i, entry in enumerate(trainer.lr_schedulers):
        for key, value in entry["scheduler"].state_dict().items():
            state[f"sched{i}.{key}"] = value
    state["rng.torch"] = torch.get_rng_state()
    generator = getattr(trainer.train_dataloader, "generator", None)
    if generator is not None:
        state["rng.loader"] = generator.get_state()
    import random

    import numpy as np

    state["rng.python"] = random.getstate()
    state["rng.numpy"] = [np.asarray(v) if hasattr(v, "shape") else v
                          for v in np.random.get_state()]
    for name in ("global_step", "current_epoch", "batch_idx", "should_stop"):
        state[f"trainer.{name}"] = getattr(trainer, name)
    state["metrics.callback"] = {k: v.clone() for k, v in trainer.callback_metrics.items()}
    state["metrics.step"] = {k: v.clone() for k, v in trainer.metrics.step_values.items()}
    state["metrics.epoch"] = {stage: {k: [v[0].clone(), v[1]] for k, v in sums.items()}
                              for stage, sums in trainer.metrics.epoch_sums.items()}
    # each plugin's state as a checkpoint would hold it (a hook takes the arguments it declares)
    for name, plugin_state in call_per_plugin(trainer.pm, "state_dict", trainer=trainer).items():
        if "finder" not in name:
            state[f"plugin.{name}"] = plugin_state
    return state


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if hasattr(a, "shape") and hasattr(b, "shape"):  # numpy arrays
        return a.shape == b.shape and bool((a == b).all())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def differences(before: dict, after: dict, skip_lr: bool = False) -> list[str]:
    """The names whose values are not bit-identical (``skip_lr``: learning-rate entries left
    out, i.e. names ending in ``lr``/``lrs``/``initial_lr`` and the schedulers' ``_last_lr``)."""
    names = sorted(set(before) | set(after))
    if skip_lr:
        names = [n for n in names if not n.endswith(("lr", "lrs"))]
    return [n for n in names if n not in before or n not in after
            or not _same(before[n], after[n])]


class StateProbe:
    """A callback plugin object that takes :func:`training_state` in its ``setup`` (a plain
    implementation: before the finders', which run last) and again at the start of the first
    epoch or, for a run that never starts one, in ``teardown``; ``differences`` and
    ``lr_differences`` compare the two (learning rates apart / only the first group's). With
    ``folder`` it writes ``probe.rank<R>.json``: those lists and the learning rates."""

    name = "state-probe"

    def __init__(self, folder: str | None = None):
        self.folder = folder
        self.before: dict | None = None
        self.after: dict | None = None

    @ptrain.hookimpl
    def setup(self, trainer, stage):
        if stage == "fit":
            self.before, self.after = training_state(trainer), None

    def _take(self, trainer) -> None:
        if self.after is None and self.before is not None:
            self.after = training_state(trainer)

    @ptrain.hookimpl
    def on_epoch_start(self, trainer):
        self._take(trainer)

    @ptrain.hookimpl
    def teardown(self, trainer):
        self._take(trainer)
        if self.folder is None:
            return
        finder = trainer.plugins.get("lr-finder")
        record = {
            "differences": differences(self.before, self.after, skip_lr=True),
            "all_differences": differences(self.before, self.after),
            "lr_before": self.before.get("opt0.outer.group0.lr"),
            "lr_after": self.after.get("opt0.outer.group0.lr"),
            "suggestion": getattr(finder, "suggestion", None),
            "lrs": getattr(finder, "lrs", None),
            "smoothed": getattr(finder, "smoothed", None),
            "world_size": trainer.world_size,
        }
        path = Path(self.folder) / f"probe.rank{trainer.global_rank}.json"
        path.write_text(json.dumps(record))


# -- the address-space-capped fit -------------------------------------------------------------


def address_space_bytes() -> int:
    """This process's virtual memory size (``VmSize``), what ``RLIMIT_AS`` limits."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def capped_fit(root: str, budget_mib: int, width: int = 4096, max_steps: int = 3,
               **finder_options) -> None:
    """Fit :class:`MemoryHungry` with ``-p batch-size-finder`` in this process, its address
    space capped at what it uses now (torch and the module loaded, one warm-up step done) plus
    ``budget_mib``; the run then trains ``max_steps`` steps. Writes ``<root>/result.json``:
    the finder's trials and result, the batch sizes the run trained on, and the cap."""
    from ptrain_finders import BatchSizeFinder

    torch.set_num_threads(1)  # one thread: no per-thread arenas or stacks appear mid-run

    def fit(module: MemoryHungry, steps: int, finder: BatchSizeFinder,
            recorder: BatchSizeRecorder) -> ptrain.Trainer:
        trainer = ptrain.Trainer(accelerator="cpu", max_steps=steps, seed=0,
                                 callbacks=[finder, recorder, *QUIET], default_root_dir=root)
        trainer.fit(module)
        return trainer

    # a whole tiny run first, uncapped: every module and kernel library the run needs is loaded
    # before the cap, so that the budget is left for tensors
    fit(MemoryHungry(n=8, width=width), 1, BatchSizeFinder(), BatchSizeRecorder())
    module = MemoryHungry(width=width)
    limit = address_space_bytes() + budget_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    finder, recorder = BatchSizeFinder(**finder_options), BatchSizeRecorder()
    trainer = fit(module, max_steps, finder, recorder)
    Path(root, "result.json").write_text(json.dumps({
        "trials": finder.trials, "found": finder.found, "batch_size": finder.batch_size,
        "trained_sizes": recorder.sizes, "limit": limit, "global_step": trainer.global_step}))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "oom":
        options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
        capped_fit(sys.argv[2], int(sys.argv[3]), **options)
    else:
        sys.exit(f"usage: python -m tests._finder_models oom ROOT BUDGET_MIB [OPTIONS_JSON]; "
                 f"got {sys.argv[1:]} (cwd {os.getcwd()})")
