"""What toggling gains in a GAN: the compute it saves on one process, and the all-reduces that
``toggle_model(opt, sync_grad=False)`` saves under DDP. ptrain, a hand-written PyTorch loop and
Lightning side by side, in one run.

    .venv/bin/python benchmarks/toggling.py                  # about 2-3 minutes on 2 CPU cores
    .venv/bin/python benchmarks/toggling.py --steps 100 --ddp-steps 48    # shorter
    .venv/bin/python benchmarks/toggling.py --hidden 1024    # a bigger model: larger differences
    .venv/bin/python benchmarks/toggling.py --only 1 --repeats 3 --no-lightning

The model is ``examples/gan.py``'s GAN on scikit-learn's 8x8 digits, with ``--hidden`` units
(default 512, against the example's 256, so that the compute toggling saves stands out of the
noise): generator ``Linear(32, H), BatchNorm1d, ReLU, Linear(H, H), BatchNorm1d, ReLU,
Linear(H, 64), Sigmoid``; discriminator ``Linear(64, H), LeakyReLU(0.2), Dropout, Linear(H, H),
LeakyReLU(0.2), Dropout, Linear(H, 1)`` with **dropout 0** (the layers stay, but random masks
would make the implementations' results incomparable); two Adam optimizers (lr 1e-3, betas
(0.5, 0.999)). ``torch.manual_seed(0)`` before building it gives every run the same initial
weights. Each dataset row is a digit (drawn with a seeded generator) *and* its latent vector, so
every run does the identical computation, whatever splits the rows into batches or processes.
Per batch, as in the example: ``fake = G(z)``; the D step (``BCE(D(real), 1) + BCE(D(fake.detach()),
0)``, backward, step); the G step (``BCE(D(fake), 1)``, backward, step). Loaders do not shuffle.

**Part 1: one process, CPU, ``torch.set_num_threads(1)``**, ``--steps`` batches of ``--batch``
rows (one epoch). What toggling saves here: in the G step's backward through D, D's weight
gradients (the D step's backward never reaches G: ``fake`` is detached). Rows:

- hand-written, toggled: ``requires_grad_(False)`` on the other part's parameters around each
  step (what ``toggle_model`` does), ``step(); zero_grad()`` after each backward;
- hand-written, not toggled: ``zero_grad()`` right before each backward (so the gradient D's
  parameters pick up in G's backward is thrown away before D's next step: the result is the
  same, only the work differs);
- ptrain, ``-p toggling`` with ``toggle_model(opt)`` around each step (as ``examples/gan.py``);
- ptrain, manual optimization without the plugin, the zero_grad-first discipline above;
- Lightning, manual optimization with ``self.toggle_optimizer(opt)`` / ``untoggle_optimizer``;
- Lightning, manual optimization without toggling, zero_grad first.

ptrain runs with progress bar, TensorBoard and checkpointing off; Lightning with progress bar,
checkpointing, logger, model summary and sanity check off. Columns: ms per batch, the **median**
(and the mean) of the intervals between consecutive batch ends after the first ``--warmup``
batches (``perf_counter`` in ptrain's ``on_train_batch_end`` hook, in a Lightning Callback's
``on_train_batch_end``, after the G step's zero_grad in the hand loop; start-up and tear-down
are left out); "vs hand" = that median over the toggled hand loop's; "toggling saves" = 1 - the
toggled median over the same trainer's untoggled one; max |dG|: the largest absolute difference
of the final generator parameters to the toggled hand loop's (the same computation, so 0 up to
float rounding; see below for the two biases it leaves out).

**Part 2: two processes, gloo on the CPU**, ``--ddp-steps`` batches of ``--ddp-batch`` rows per
rank (each rank gets every second row: a ``DistributedSampler`` without shuffling). D steps
every batch, synchronised; the generator accumulates ``BCE(D(fake), 1) / K`` over windows of
``--window`` K=4 batches and steps at each window's end. Rows:

- hand-written DDP: ``DistributedDataParallel(G)`` and ``DistributedDataParallel(D)`` apart; the
  G step runs D's plain module (``ddp_d.module``) with D's parameters switched off, and G's
  forward and backward run inside ``ddp_g.no_sync()`` for the first K-1 batches of a window
  ("no_sync"), or never ("sync every backward");
- ptrain ``--strategy ddp --devices 2`` with ``-p toggling``: ``toggle_model(opt_d)`` for D,
  ``toggle_model(opt_g, sync_grad=False)`` for the first K-1 G backwards of a window and
  ``sync_grad=True`` for the last, or ``sync_grad=True`` for all. ptrain wraps the whole module
  (G and D) in one DDP, with ``find_unused_parameters`` on (its default for manual optimization),
  and arms DDP's reducer per backward when ``trainer.sync_gradients``;
- Lightning ``DDPStrategy(find_unused_parameters=True)`` (needed: a toggled backward leaves
  parameters without gradients), ``opt.toggle_model(sync_grad=...)`` the same way. Lightning
  starts rank 1 by running this script again; it gets a free ``MASTER_PORT`` of its own. (Its
  DDP forward, around ``training_step``, arms the reducer afterwards for a backward that never
  comes; harmless here, as each batch's first backward, D's, is synchronised and re-arms it.)
  Skipped when ``lightning`` can't be imported, reported with its error when it fails.

Each process uses 1 intra-op thread. The gradient all-reduces are counted with a DDP
communication hook that counts and then calls torch's own ``default_hooks.allreduce_hook``
(registered from a ptrain callback's ``setup`` hook on ``trainer.model``, from a Lightning
Callback's ``on_fit_start`` on ``trainer.strategy.model`` (Lightning wraps the model after the
callbacks' ``setup``, and registers comm hooks of its own only on CUDA), on both DDP wrappers in
the hand loop): one call per gradient bucket all-reduced; "MB/window" sums the buckets' sizes.
ptrain and Lightning wrap G and D in one DDP, whose buckets mix both parts' gradients, so each
synchronised backward all-reduces the whole model's buckets (D's backward carries G's part too:
zeros, or G's gradient accumulated so far in the window, which is then averaged early, harmless
as averaging is linear); the hand loop's two wrappers all-reduce only the part being trained.
With ``find_unused_parameters`` DDP also all-reduces a small map of the used parameters per
synchronised backward, outside the comm hook: not counted. Columns: ms per batch, the median
over windows (after ``--warmup-windows``) of a window's time / K, the slower rank's; hook calls
and MB per window after the warm-up (rank 0's; both ranks' when they differ); max |dG| of the
generator parameters (rank 0) to the hand-written no_sync loop's, after the first generator
step (the end of batch K) and at the end. The two hand-written loops add the window's gradients
in a different order (all-reduce the sum, or all-reduce each term), so after the first step
they differ by float rounding (~1e-6); the GAN's training then amplifies such differences from
step to step (D learns from G's samples, G from D's scores, Adam rescales small gradients), to
~1e-2 after 30 windows. An implementation that trained differently (a window's first
gradients lost, or a rank's own gradient stepped instead of the average) would be off by about
lr = 1e-3 after the first step already (Adam's first step is about lr x sign(gradient)).

max |dG| leaves out the biases of the generator's two Linear layers that feed a BatchNorm: the
BatchNorm subtracts the batch mean, so their gradient is 0 up to float rounding, and Adam, which
divides by the gradient's running magnitude, turns that rounding noise into steps of up to lr.
Runs that add the same gradients in another order (a window's sum all-reduced once, against its
terms all-reduced one by one) have these biases ~1e-3 apart after the first step, while every
other parameter agrees to ~1e-6.

Every configuration runs in a child process of its own (its workers are that child's children),
so no process group, thread setting or allocator state carries over. How busy other processes
kept the CPUs during each configuration (from ``/proc/stat``) is printed with it: on a shared
machine, the main source of noise. ``--repeats N`` runs every configuration N times, in an order
that rotates from repeat to repeat, and keeps the fastest run (noise only ever adds time).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import ptrain
from ptrain_toggling import toggle_model

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from overhead import CpuLoad, source_revision  # noqa: E402  (through HERE)

LATENT = 32
PIXELS = 64
WORLD = 2

# name: (part, implementation, variant, label)
CONFIGS = {
    "hand-toggle": (1, "hand", True, "hand-written, requires_grad toggled"),
    "hand-plain": (1, "hand", False, "hand-written, no toggling"),
    "ptrain-toggle": (1, "ptrain", True, "ptrain, -p toggling + toggle_model"),
    "ptrain-plain": (1, "ptrain", False, "ptrain manual, no toggle_model"),
    "lightning-toggle": (1, "lightning", True, "lightning, toggle_optimizer"),
    "lightning-plain": (1, "lightning", False, "lightning manual, no toggling"),
    "ddp-hand-nosync": (2, "hand", False, "hand-written DDP, no_sync() K-1 of K"),
    "ddp-hand-sync": (2, "hand", True, "hand-written DDP, sync every backward"),
    "ddp-ptrain-nosync": (2, "ptrain", False, "ptrain ddp, toggle_model(sync_grad=False) K-1 of K"),
    "ddp-ptrain-sync": (2, "ptrain", True, "ptrain ddp, toggle_model(sync_grad=True) always"),
    "ddp-lightning-nosync": (2, "lightning", False,
                             "lightning ddp, toggle_model(sync_grad=False) K-1 of K"),
    "ddp-lightning-sync": (2, "lightning", True,
                           "lightning ddp, toggle_model(sync_grad=True) always"),
}
PART1_BASE = "hand-toggle"
PART2_BASE = "ddp-hand-nosync"


# ---------------------------------------------------------------------------------------------
# The model, the data and the losses (the same for every implementation)


def build_gan(hidden: int) -> tuple[nn.Sequential, nn.Sequential]:
    """``examples/gan.py``'s generator and discriminator, dropout 0, from seed 0."""
    torch.manual_seed(0)
    generator = nn.Sequential(
        nn.Linear(LATENT, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
        nn.Linear(hidden, PIXELS), nn.Sigmoid(),
    )
    discriminator = nn.Sequential(
        nn.Linear(PIXELS, hidden), nn.LeakyReLU(0.2), nn.Dropout(0.0),
        nn.Linear(hidden, hidden), nn.LeakyReLU(0.2), nn.Dropout(0.0),
        nn.Linear(hidden, 1),
    )
    return generator, discriminator


def adam_pair(generator: nn.Module, discriminator: nn.Module) -> list[torch.optim.Optimizer]:
    betas = (0.5, 0.999)
    return [torch.optim.Adam(generator.parameters(), lr=1e-3, betas=betas),
            torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=betas)]


def gan_data(rows: int) -> TensorDataset:
    """``rows`` rows of (digit, latent vector): digits drawn from scikit-learn's 1,797 with a
    seeded generator, pixels scaled to [0, 1]; the noise is part of the row."""
    from sklearn.datasets import load_digits

    images = torch.tensor(load_digits().data, dtype=torch.float32) / 16.0
    g = torch.Generator().manual_seed(0)
    picks = torch.randint(0, len(images), (rows,), generator=g)
    return TensorDataset(images[picks], torch.randn(rows, LATENT, generator=g))


def d_loss(discriminator: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    real_logits, fake_logits = discriminator(real), discriminator(fake)
    return (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
            + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))


def g_loss(discriminator: nn.Module, fake: torch.Tensor) -> torch.Tensor:
    logits = discriminator(fake)
    return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))


def set_trainable(module: nn.Module, flag: bool) -> None:
    for param in module.parameters():
        param.requires_grad_(flag)


# ---------------------------------------------------------------------------------------------
# What every rank records


def _counting_allreduce(state, bucket):
    """torch's default all-reduce comm hook (sum, divided by the world size), counted. (No
    annotations: DDP checks real ones, and this file's are strings.)"""
    state.calls += 1
    state.bytes += bucket.buffer().numel() * bucket.buffer().element_size()
    return default_hooks.allreduce_hook(None, bucket)


def generator_params(generator: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in generator.named_parameters()}


class Record:
    """Per batch: the time at its end and the comm hook's counts so far; written to
    ``rank<R>.json`` in the configuration's folder. Rank 0 also saves the generator's
    parameters after its first step (the end of batch ``first_g_step``) and at the end."""

    def __init__(self, out_dir: str, first_g_step: int):
        self.out_dir, self.first_g_step = out_dir, first_g_step
        self.calls = self.bytes = 0
        self.times: list[float] = []
        self.call_counts: list[int] = []
        self.byte_counts: list[int] = []
        self.first: dict[str, torch.Tensor] | None = None

    def batch_end(self, generator: nn.Module) -> None:
        self.times.append(time.perf_counter())
        self.call_counts.append(self.calls)
        self.byte_counts.append(self.bytes)
        if len(self.times) == self.first_g_step + 1:  # a copy once: not worth timing apart
            self.first = generator_params(generator)

    def write(self, rank: int, generator: nn.Module) -> None:
        if not self.times:
            return
        if rank == 0:
            torch.save({"first": self.first, "final": generator_params(generator)},
                       os.path.join(self.out_dir, "generator.pt"))
        with open(os.path.join(self.out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "times": self.times, "calls": self.call_counts,
                       "bytes": self.byte_counts, "threads": torch.get_num_threads()}, f)


# ---------------------------------------------------------------------------------------------
# Hand-written loops


def hand_single(args: argparse.Namespace, toggle: bool) -> None:
    torch.set_num_threads(1)
    generator, discriminator = build_gan(args.hidden)
    opt_g, opt_d = adam_pair(generator, discriminator)
    loader = DataLoader(gan_data(args.steps * args.batch), batch_size=args.batch)
    record = Record(args.out, first_g_step=0)
    generator.train()
    discriminator.train()
    for real, z in loader:
        fake = generator(z)
        if toggle:
            set_trainable(generator, False)
            d_loss(discriminator, real, fake.detach()).backward()
            opt_d.step()
            opt_d.zero_grad()
            set_trainable(generator, True)
            set_trainable(discriminator, False)
            g_loss(discriminator, fake).backward()
            opt_g.step()
            opt_g.zero_grad()
            set_trainable(discriminator, True)
        else:
            opt_d.zero_grad()
            d_loss(discriminator, real, fake.detach()).backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss(discriminator, fake).backward()  # also fills D's .grad: thrown away above
            opt_g.step()
        record.batch_end(generator)
    record.write(0, generator)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand_ddp_worker(rank: int, port: int, args: argparse.Namespace, sync_always: bool) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    try:
        generator, discriminator = build_gan(args.hidden)
        ddp_g, ddp_d = DistributedDataParallel(generator), DistributedDataParallel(discriminator)
        record = Record(args.out, first_g_step=args.window - 1)
        for model in (ddp_g, ddp_d):
            model.register_comm_hook(record, _counting_allreduce)
        opt_g, opt_d = adam_pair(generator, discriminator)
        data = gan_data(WORLD * args.ddp_steps * args.ddp_batch)
        sampler = DistributedSampler(data, num_replicas=WORLD, rank=rank, shuffle=False)
        loader = DataLoader(data, batch_size=args.ddp_batch, sampler=sampler)
        ddp_g.train()
        ddp_d.train()
        k = args.window
        for batch_idx, (real, z) in enumerate(loader):
            last = (batch_idx + 1) % k == 0
            sync = last or sync_always
            with nullcontext() if sync else ddp_g.no_sync():  # a context manager per use
                fake = ddp_g(z)
            set_trainable(generator, False)
            d_loss(ddp_d, real, fake.detach()).backward()
            opt_d.step()
            opt_d.zero_grad()
            set_trainable(generator, True)
            set_trainable(discriminator, False)
            with nullcontext() if sync else ddp_g.no_sync():
                (g_loss(discriminator, fake) / k).backward()  # D's plain module: no D sync
            if last:
                opt_g.step()
                opt_g.zero_grad()
            set_trainable(discriminator, True)
            record.batch_end(generator)
        record.write(rank, generator)
        dist.barrier()  # leave together: gloo aborts a process whose peer tore down first
    finally:
        dist.destroy_process_group()


def hand_ddp(args: argparse.Namespace, sync_always: bool) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(hand_ddp_worker, args=(_free_port(), args, sync_always), nprocs=WORLD,
                       start_method="spawn")


# ---------------------------------------------------------------------------------------------
# ptrain (module level: pickled to the DDP workers)


class PtrainGAN(ptrain.TrainModule):
    automatic_optimization = False

    def __init__(self, hidden: int, data: TensorDataset, batch_size: int, toggle: bool,
                 window: int = 1, sync_always: bool = True):
        super().__init__()
        self.generator, self.discriminator = build_gan(hidden)
        self.data, self.batch_size = data, batch_size
        self.toggle, self.window, self.sync_always = toggle, window, sync_always

    def training_step(self, batch, batch_idx):
        real, z = batch
        opt_g, opt_d = self.optimizers()
        fake = self.generator(z)
        if not self.toggle:
            opt_d.zero_grad()
            self.manual_backward(d_loss(self.discriminator, real, fake.detach()))
            opt_d.step()
            opt_g.zero_grad()
            loss = g_loss(self.discriminator, fake)
            self.manual_backward(loss)
            opt_g.step()
            return loss.detach()
        with toggle_model(opt_d):
            self.manual_backward(d_loss(self.discriminator, real, fake.detach()))
            opt_d.step()
            opt_d.zero_grad()
        last = (batch_idx + 1) % self.window == 0
        with toggle_model(opt_g, sync_grad=last or self.sync_always):
            loss = g_loss(self.discriminator, fake) / self.window
            self.manual_backward(loss)
            if last:
                opt_g.step()
                opt_g.zero_grad()
        return loss.detach()

    def configure_optimizers(self):
        return adam_pair(self.generator, self.discriminator)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


class PtrainRecorder(Record):
    """A ptrain callback plugin: batch-end times; under DDP, the counting comm hook."""

    name = "toggling-bench-recorder"

    @ptrain.hookimpl
    def setup(self, trainer, stage):
        torch.set_num_threads(1)
        from torch.nn.parallel import DistributedDataParallel

        if stage == "fit" and isinstance(trainer.model, DistributedDataParallel):
            trainer.model.register_comm_hook(self, _counting_allreduce)

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer):
        self.batch_end(trainer.module.generator)

    @ptrain.hookimpl
    def teardown(self, trainer, stage):
        self.write(trainer.global_rank, trainer.module.generator)


def run_ptrain(args: argparse.Namespace, part: int, variant: bool) -> None:
    torch.set_num_threads(1)
    quiet = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]
    if part == 1:
        module = PtrainGAN(args.hidden, gan_data(args.steps * args.batch), args.batch,
                           toggle=variant)
        callbacks = (["toggling"] if variant else []) + quiet
        trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1,
                                 callbacks=[*callbacks, PtrainRecorder(args.out, 0)],
                                 default_root_dir=os.path.join(args.out, "runs"))
    else:
        module = PtrainGAN(args.hidden, gan_data(WORLD * args.ddp_steps * args.ddp_batch),
                           args.ddp_batch, toggle=True, window=args.window, sync_always=variant)
        trainer = ptrain.Trainer(
            accelerator="cpu", strategy="ddp", devices=WORLD, max_epochs=1,
            callbacks=["toggling", *quiet, PtrainRecorder(args.out, args.window - 1)],
            default_root_dir=os.path.join(args.out, "runs"),
            plugin_options={"ddp": {"timeout": float(args.timeout)}})
    trainer.fit(module)


# ---------------------------------------------------------------------------------------------
# Lightning (rank 1 of its DDP runs this script again, and comes through here too)


def run_lightning(args: argparse.Namespace, part: int, variant: bool) -> None:
    import logging
    import warnings

    import lightning
    from torch.utils.data import DistributedSampler

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    hidden, window = args.hidden, args.window
    if part == 1:
        data, batch_size = gan_data(args.steps * args.batch), args.batch
    else:
        data, batch_size = gan_data(WORLD * args.ddp_steps * args.ddp_batch), args.ddp_batch

    class LightningGAN(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.generator, self.discriminator = build_gan(hidden)

        def training_step(self, batch, batch_idx):
            real, z = batch
            opt_g, opt_d = self.optimizers()
            fake = self.generator(z)
            if part == 2:
                with opt_d.toggle_model():
                    self.manual_backward(d_loss(self.discriminator, real, fake.detach()))
                    opt_d.step()
                    opt_d.zero_grad()
                last = (batch_idx + 1) % window == 0
                with opt_g.toggle_model(sync_grad=last or variant):
                    loss = g_loss(self.discriminator, fake) / window
                    self.manual_backward(loss)
                    if last:
                        opt_g.step()
                        opt_g.zero_grad()
            elif variant:
                self.toggle_optimizer(opt_d)
                self.manual_backward(d_loss(self.discriminator, real, fake.detach()))
                opt_d.step()
                opt_d.zero_grad()
                self.untoggle_optimizer(opt_d)
                self.toggle_optimizer(opt_g)
                loss = g_loss(self.discriminator, fake)
                self.manual_backward(loss)
                opt_g.step()
                opt_g.zero_grad()
                self.untoggle_optimizer(opt_g)
            else:
                opt_d.zero_grad()
                self.manual_backward(d_loss(self.discriminator, real, fake.detach()))
                opt_d.step()
                opt_g.zero_grad()
                loss = g_loss(self.discriminator, fake)
                self.manual_backward(loss)
                opt_g.step()
            return loss.detach()

        def configure_optimizers(self):
            return adam_pair(self.generator, self.discriminator)

        def train_dataloader(self):
            if part == 1:
                return DataLoader(data, batch_size=batch_size)
            # Lightning's own DistributedSampler would shuffle (use_distributed_sampler=False)
            sampler = DistributedSampler(data, num_replicas=self.trainer.world_size,
                                         rank=self.trainer.global_rank, shuffle=False)
            return DataLoader(data, batch_size=batch_size, sampler=sampler)

    class Recorder(lightning.Callback):
        def __init__(self):
            self.record = Record(args.out, first_g_step=0 if part == 1 else window - 1)

        def setup(self, trainer, pl_module, stage):
            torch.set_num_threads(1)  # Lightning may have set its own by now

        def on_fit_start(self, trainer, pl_module):
            from torch.nn.parallel import DistributedDataParallel

            if isinstance(trainer.strategy.model, DistributedDataParallel):
                trainer.strategy.model.register_comm_hook(self.record, _counting_allreduce)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.record.batch_end(pl_module.generator)

        def on_train_end(self, trainer, pl_module):
            self.record.write(trainer.global_rank, pl_module.generator)

    if part == 1:
        strategy, devices = "auto", 1
    else:
        from lightning.pytorch.strategies import DDPStrategy

        strategy, devices = DDPStrategy(find_unused_parameters=True,
                                        process_group_backend="gloo"), WORLD
    trainer = lightning.Trainer(
        accelerator="cpu", strategy=strategy, devices=devices, max_epochs=1,
        enable_progress_bar=False, enable_checkpointing=False, logger=False,
        enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=False,
        callbacks=[Recorder()], default_root_dir=os.path.join(args.out, "runs"))
    trainer.fit(LightningGAN())


def child(name: str, args: argparse.Namespace) -> None:
    part, implementation, variant, _ = CONFIGS[name]
    if implementation == "hand":
        if part == 1:
            hand_single(args, toggle=variant)
        else:
            hand_ddp(args, sync_always=variant)
    elif implementation == "ptrain":
        run_ptrain(args, part, variant)
    else:
        run_lightning(args, part, variant)


# ---------------------------------------------------------------------------------------------
# The parent: one child per configuration, then the tables


def child_command(name: str, out_dir: str, args: argparse.Namespace) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", out_dir,
            "--steps", str(args.steps), "--batch", str(args.batch), "--warmup", str(args.warmup),
            "--ddp-steps", str(args.ddp_steps), "--ddp-batch", str(args.ddp_batch),
            "--window", str(args.window), "--warmup-windows", str(args.warmup_windows),
            "--hidden", str(args.hidden), "--timeout", str(args.timeout)]


def run_config(name: str, args: argparse.Namespace) -> dict:
    part = CONFIGS[name][0]
    processes = 1 if part == 1 else WORLD
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    if CONFIGS[name][1] == "lightning":  # Lightning's ranks meet there (a free port of its own)
        env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(_free_port())
    with tempfile.TemporaryDirectory(prefix="ptrain-bench-toggling-") as out_dir, \
            tempfile.TemporaryFile(mode="w+") as log:
        load = CpuLoad()
        start = time.perf_counter()
        # a session of its own: on a time-out, the child and the workers it started go together
        proc = subprocess.Popen(child_command(name, out_dir, args), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"name": name, "error": f"timed out after {args.timeout} s (--timeout)"}
        wall = time.perf_counter() - start
        others = load.others_percent()
        records = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank*.json"))]
        generator_file = Path(out_dir) / "generator.pt"
        generator = torch.load(generator_file) if generator_file.exists() else None
        log.seek(0)
        output = log.read()
    if code != 0 or len(records) != processes or generator is None:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        if args.verbose:
            print(output, file=sys.stderr)
        return {"name": name, "error": f"failed (exit code {code}, {len(records)} rank files): "
                                       f"{lines[-1] if lines else ''}"}
    result = {"name": name, "wall_s": wall, "others": others, "generator": generator,
              "threads": records[0]["threads"]}
    result.update(summarize_part1(records[0], args) if part == 1
                  else summarize_part2(records, args))
    return result


def summarize_part1(record: dict, args: argparse.Namespace) -> dict:
    times = record["times"]
    if len(times) != args.steps:
        raise RuntimeError(f"{len(times)} batches recorded, expected {args.steps}")
    intervals = [b - a for a, b in itertools.pairwise(times[args.warmup - 1:])]
    return {"ms": 1e3 * statistics.median(intervals),
            "mean_ms": 1e3 * statistics.fmean(intervals)}


def summarize_part2(records: list[dict], args: argparse.Namespace) -> dict:
    k, first = args.window, args.warmup_windows
    per_rank_ms, calls, megabytes = [], [], []
    for record in records:
        times = record["times"]
        if len(times) != args.ddp_steps:
            raise RuntimeError(f"{len(times)} batches recorded, expected {args.ddp_steps}")
        ends = list(range(first * k - 1, len(times), k))  # the last batch of each window
        windows = [times[b] - times[a] for a, b in itertools.pairwise(ends)]
        per_rank_ms.append(1e3 * statistics.median(windows) / k)
        timed = len(ends) - 1
        calls.append((record["calls"][ends[-1]] - record["calls"][ends[0]]) / timed)
        megabytes.append((record["bytes"][ends[-1]] - record["bytes"][ends[0]]) / timed / 2**20)
    return {"ms": max(per_rank_ms), "calls": calls, "megabytes": megabytes}


def best(attempts: list[dict]) -> dict:
    """The fastest attempt (noise only ever adds time), else the last error."""
    done = [a for a in attempts if "error" not in a]
    return min(done, key=lambda a: a["ms"]) if done else attempts[-1]


def pre_batchnorm_biases(generator: nn.Sequential) -> set[str]:
    """The biases of the Linear layers that feed a BatchNorm, left out of max |dG| (their
    gradient is rounding noise that Adam amplifies: see the module's doc)."""
    layers = list(generator.named_children())
    return {f"{name}.bias" for (name, layer), (_, following) in itertools.pairwise(layers)
            if isinstance(layer, nn.Linear) and isinstance(following, nn.BatchNorm1d)}


def max_difference(result: dict, base: dict | None, skip: set[str], when: str = "final") -> str:
    """The largest absolute difference of the generator parameters after the first G step
    (``when="first"``) or at the end, ``skip`` left out."""
    if base is None or "error" in base:
        return "?"
    if result is base:
        return "(reference)"
    diff = max((result["generator"][when][k] - v).abs().max().item()
               for k, v in base["generator"][when].items() if k not in skip)
    return "0" if diff == 0 else f"{diff:.1e}"


def markdown(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _others(result: dict) -> str:
    return "?" if result["others"] is None else f"{result['others']:.0f}%"


def _per_rank(values: list[float], fmt: str) -> str:
    shown = [format(v, fmt) for v in values]
    return shown[0] if len(set(shown)) == 1 else " / ".join(shown)


def table_part1(results: dict[str, dict], skip: set[str]) -> str:
    base = results.get(PART1_BASE)
    base_ok = base is not None and "error" not in base
    rows = [("implementation", "ms/batch (median)", "ms/batch (mean)", "vs hand toggled",
             "toggling saves", "max |dG| vs hand toggled", "run s", "others' CPU")]
    for name, r in results.items():
        label = CONFIGS[name][3]
        if "error" in r:
            rows.append((label, "failed: see below", *["-"] * 6))
            continue
        implementation, toggled = CONFIGS[name][1], CONFIGS[name][2]
        saves = ""
        partner = results.get(f"{implementation}-plain")
        if toggled and partner is not None and "error" not in partner:
            saves = f"{100 * (1 - r['ms'] / partner['ms']):+.1f}%"
        rows.append((label, f"{r['ms']:.2f}", f"{r['mean_ms']:.2f}",
                     f"{r['ms'] / base['ms']:.2f}x" if base_ok else "?", saves,
                     max_difference(r, base, skip), f"{r['wall_s']:.1f}", _others(r)))
    return markdown(rows)


def table_part2(results: dict[str, dict], skip: set[str]) -> str:
    base = results.get(PART2_BASE)
    base_ok = base is not None and "error" not in base
    rows = [("implementation", "ms/batch (median window / K)", "vs hand no_sync",
             "all-reduces/window", "MB all-reduced/window", "max |dG| after 1st G step",
             "max |dG| final", "run s", "others' CPU")]
    for name, r in results.items():
        label = CONFIGS[name][3]
        if "error" in r:
            rows.append((label, "failed: see below", *["-"] * 7))
            continue
        rows.append((label, f"{r['ms']:.2f}", f"{r['ms'] / base['ms']:.2f}x" if base_ok else "?",
                     _per_rank(r["calls"], ".1f"), _per_rank(r["megabytes"], ".2f"),
                     max_difference(r, base, skip, "first"), max_difference(r, base, skip),
                     f"{r['wall_s']:.1f}", _others(r)))
    return markdown(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512,
                        help="hidden units of both networks (examples/gan.py: 256)")
    parser.add_argument("--steps", type=int, default=300, help="part 1: batches per run")
    parser.add_argument("--batch", type=int, default=64, help="part 1: rows per batch")
    parser.add_argument("--warmup", type=int, default=20,
                        help="part 1: batches left out of the timing (at least 1)")
    parser.add_argument("--ddp-steps", type=int, default=120,
                        help="part 2: batches per rank per run (a multiple of --window)")
    parser.add_argument("--ddp-batch", type=int, default=32, help="part 2: rows per batch per rank")
    parser.add_argument("--window", type=int, default=4,
                        help="part 2: K, the batches over which the generator accumulates")
    parser.add_argument("--warmup-windows", type=int, default=2,
                        help="part 2: windows left out of the timing and the counts (at least 1)")
    parser.add_argument("--only", choices=("1", "2"), help="run only part 1 or part 2")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning's rows")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each configuration; the fastest is reported (default 1)")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per configuration")
    parser.add_argument("--verbose", action="store_true",
                        help="print the whole output of a configuration that failed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 1 <= args.warmup <= args.steps - 3:
        parser.error("need 1 <= --warmup <= --steps - 3")
    if args.window < 1 or args.ddp_steps % args.window:
        parser.error("--ddp-steps must be a multiple of --window")
    if not 1 <= args.warmup_windows <= args.ddp_steps // args.window - 3:
        parser.error("need 1 <= --warmup-windows <= --ddp-steps / --window - 3")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    import importlib.util

    parts = [int(args.only)] if args.only else [1, 2]
    names = [n for n, c in CONFIGS.items() if c[0] in parts]
    have_lightning = importlib.util.find_spec("lightning") is not None
    skipped = []
    if args.no_lightning or not have_lightning:
        names = [n for n in names if CONFIGS[n][1] != "lightning"]
        skipped.append("lightning: " + ("--no-lightning" if have_lightning
                                        else "lightning is not importable"))
    print(f"# toggling benchmark: examples/gan.py's GAN, hidden {args.hidden}, dropout 0, Adam; "
          f"CPU, 1 intra-op thread per process; {os.cpu_count()} CPUs "
          f"({os.sched_getaffinity(0).__len__()} usable), torch {torch.__version__}; "
          f"ptrain at {source_revision()}\n", flush=True)
    start = time.perf_counter()
    attempts: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        for part in parts:  # part 1's configurations, then part 2's, each rotating per repeat
            group = [n for n in names if CONFIGS[n][0] == part]
            shift = repeat % len(group)
            for name in group[shift:] + group[:shift]:
                attempts[name].append(run_config(name, args))
                print(f"  done: {name} ({attempts[name][-1].get('wall_s', 0):.1f} s)",
                      file=sys.stderr, flush=True)
    results = {name: best(attempts[name]) for name in names}
    skip = pre_batchnorm_biases(build_gan(args.hidden)[0])
    best_of = f", the fastest of {args.repeats} runs" if args.repeats > 1 else ""
    if 1 in parts:
        print(f"## Part 1: one process, {args.steps} batches of {args.batch} "
              f"({args.warmup} warm-up){best_of}\n")
        print(table_part1({n: r for n, r in results.items() if CONFIGS[n][0] == 1}, skip))
        print("\nms/batch: median (and mean) of the intervals between batch ends after the "
              "warm-up. toggling saves: against the same trainer without toggling. max |dG|: "
              "final generator parameters against the toggled hand-written loop's "
              f"(without {', '.join(sorted(skip))}: see the module's doc).\n")
    if 2 in parts:
        print(f"## Part 2: {WORLD} gloo processes, {args.ddp_steps} batches of {args.ddp_batch} "
              f"per rank, generator accumulating over K={args.window} batches "
              f"({args.warmup_windows} warm-up windows){best_of}\n")
        print(table_part2({n: r for n, r in results.items() if CONFIGS[n][0] == 2}, skip))
        print(f"\nms/batch: the median over windows of a window's time / K, the slower rank's. "
              f"all-reduces/window: calls of the counting DDP comm hook (one per gradient "
              f"bucket) per window of K batches after the warm-up, rank 0's (two values: rank 0 "
              f"/ rank 1); MB: the buckets' sizes. max |dG|: generator parameters (rank 0) after "
              f"the first generator step (batch K) and at the end, against the hand-written "
              f"no_sync loop's (without {', '.join(sorted(skip))}: their gradient is rounding "
              f"noise that Adam amplifies); the GAN's training amplifies rounding differences "
              f"from step to step, so the final column grows with --ddp-steps even between "
              f"correct runs (see the module's doc).")
    for name, r in results.items():
        if "error" in r:
            print(f"\n{CONFIGS[name][3]} {r['error']}")
    for line in skipped:
        print(f"skipped: {line}")
    print(f"\nmachine: {os.cpu_count()} CPUs, torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}; total: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
