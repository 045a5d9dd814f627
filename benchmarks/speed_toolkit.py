"""The speed-toolkit plugins, each OFF and ON, against a hand-written PyTorch loop and Lightning.

One run, one table. Rows: (workload, configuration); for each of three runners (ptrain, the
hand-written loop, Lightning) the time per step, the ratio to the row it is compared with, and
peak memory. ``docs/speed-toolkit.md`` explains every column and reads a run's figures.

* **Workloads.** ``digits``: the digits example's ``DigitsClassifier`` as its config configures
  it (``ptrain example digits``: its init args, precision, seed and 10 epochs; shuffled
  batches of 32, dropout, AdamW with a cosine schedule per epoch, validation every epoch).
  ``transformer``: ``benchmarks/overhead.py``'s ``TinyTransformer`` and its workload (c): batch 16
  of random tokens, AdamW, one epoch, no validation.
* **Configurations** (ptrain's spelling; the hand loop and Lightning do their own equivalent):
  baseline (ptrain's defaults), ``-p compile`` (default mode and
  ``max-autotune-no-cudagraphs``), ``-p profiler`` (recorded steps and the others, separately),
  ``-p activation-checkpointing``, ``-p no:dataloading``, ``--dataloading-apply``,
  ``--dataloading-preload``, ``--detect-anomaly``. Where a runner has no equivalent its cell is
  "—" (the reasons are printed under the table).
* **Each measurement is one fit in a fresh process**, forked by a fork server that imported every
  library first (so imports count in neither time nor memory, and CUDA is first touched in the
  measuring process). Every process builds the same initial weights (seeded as ``ptrain fit``
  seeds them) and the same batches; the arms of a workload run ``--repeats`` times, in an order
  that rotates from repeat to repeat.
* **Time per step**: host time between the ends of consecutive training steps (after the
  optimizer step; on CUDA after a ``torch.cuda.synchronize()``), leaving out the warm-up steps,
  each epoch's first step (the gap between epochs) and each epoch's last (a smaller batch, and
  validation inside ptrain's and Lightning's). Median of the steps of all repeats, with their
  interquartile range.
* **Memory**: on CPU, the peak RSS growth during ``fit`` (``VmHWM`` after it, reset through
  ``/proc/self/clear_refs`` just before, minus ``VmRSS`` then), median over repeats; on CUDA,
  ``torch.cuda.max_memory_allocated()`` over the fit. Plus, per row, the exact activation memory
  of one forward + backward of the model as the arm left it (``benchmarks/activation_checkpointing
  .py``'s storage counter: held after forward / peak), not available for compiled arms.
* **Equal work**: the final training loss of ptrain and of Lightning minus the hand loop's, max
  abs difference over repeats (expected 0 or float rounding except for compiled arms).

Run from the repository root (Linux)::

    .venv/bin/python benchmarks/speed_toolkit.py            # the full run (minutes on 2 cores)
    .venv/bin/python benchmarks/speed_toolkit.py --quick    # a smoke check (< 1 minute)
    .venv/bin/python benchmarks/speed_toolkit.py --workload transformer --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.metadata
import importlib.util
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
import tomllib
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ptrain  # noqa: E402
from benchmarks.activation_checkpointing import memory as activation_memory  # noqa: E402
from benchmarks.overhead import (  # noqa: E402
    WORKLOADS as OVERHEAD_WORKLOADS,
    CpuLoad,
    PtrainModule,
    TinyTransformer,
    cpu_name,
    markdown_table,
    quiet,
    source_revision,
)
from ptrain.seeding import seed_everything  # noqa: E402

HAVE_LIGHTNING = importlib.util.find_spec("lightning") is not None
RUNNERS = ("ptrain", "hand", "lightning")
MiB = 2**20


# ---------------------------------------------------------------------------------------------
# Workloads: each builds, in every process, the same initial weights and the same batches.


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    epochs: int
    warmup: int           # steps from the start of fit left out of the step times
    seed: int
    precision: str
    build: Callable[[Workload], ptrain.TrainModule]
    blocks: Callable[[nn.Module], list[nn.Module]] | None  # the blocks a user would checkpoint
    logs: bool            # training_step calls self.log (the Lightning twin does the same)
    validates: bool
    steps: int = 0        # transformer: batches in its one epoch

    def quick(self) -> Workload:
        if self.key == "digits":
            return replace(self, epochs=2)
        return replace(self, steps=25, warmup=5)


def _digits_toml() -> dict[str, Any]:
    from ptrain.examples import config_path

    return tomllib.loads(Path(config_path("digits")).read_text())


def build_digits(work: Workload) -> ptrain.TrainModule:
    """The class and init args the digits example's config names, seeded as ``ptrain fit``
    does."""
    model = _digits_toml()["model"]
    module_name, class_name = model["class_path"].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    seed_everything(work.seed)
    return cls(**model.get("init_args", {}))


def build_transformer(work: Workload) -> ptrain.TrainModule:
    """``benchmarks/overhead.py``'s workload (c): TinyTransformer, batch 16, AdamW, in order."""
    spec = OVERHEAD_WORKLOADS["c"]
    seed_everything(work.seed)
    net = spec.build()
    data = spec.make_data(work.steps * spec.batch_size, torch.Generator().manual_seed(1))
    return PtrainModule(net, DataLoader(data, batch_size=spec.batch_size), spec)


def transformer_blocks(net: nn.Module) -> list[nn.Module]:
    assert isinstance(net, TinyTransformer)
    return list(net.encoder.layers)


def workloads() -> dict[str, Workload]:
    trainer = _digits_toml()["trainer"]
    return {w.key: w for w in (
        Workload("digits", "ptrain example digits: DigitsClassifier (MLP 64-128-10, dropout), "
                 "batch 32, AdamW + cosine, validation every epoch",
                 epochs=trainer["max_epochs"], warmup=45, seed=trainer["seed"],
                 precision=trainer["precision"], build=build_digits, blocks=None, logs=True,
                 validates=True),
        Workload("transformer", "TinyTransformer (benchmarks/overhead.py workload c): d_model 64, "
                 "2 layers, seq 32, batch 16, AdamW",
                 epochs=1, warmup=10, seed=0, precision="32-true", build=build_transformer,
                 blocks=transformer_blocks, logs=False, validates=False, steps=80),
    )}


# ---------------------------------------------------------------------------------------------
# Configurations: what each runner does for each row.

COMPILE_MODE = {"compile": "default", "compile-mat": "max-autotune-no-cudagraphs"}


@dataclass(frozen=True)
class Config:
    key: str
    label: str                       # ptrain's command-line spelling
    ref: str | None                  # the row this one is compared with
    callbacks: tuple[str, ...] = ()  # ptrain's -p values
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # ptrain's plugin options
    anomaly: bool = False
    hand: bool = True                # the hand loop and Lightning have an equivalent
    quick: tuple[str, ...] = RUNNERS  # the runners that run it with --quick

    @property
    def compiled(self) -> bool:
        return self.key in COMPILE_MODE


CONFIGS = {c.key: c for c in (
    Config("baseline", "baseline", None),
    Config("compile", "-p compile", "baseline", callbacks=("compile",), quick=("ptrain",)),
    Config("compile-mat", "-p compile --compile-mode max-autotune-no-cudagraphs", "baseline",
           callbacks=("compile",),
           options={"compile": {"mode": "max-autotune-no-cudagraphs"}}, quick=()),
    Config("profiler", "-p profiler", "baseline", callbacks=("profiler",)),
    Config("checkpointing", "-p activation-checkpointing", "baseline",
           callbacks=("activation-checkpointing",)),
    Config("no-dataloading", "-p no:dataloading", "baseline", callbacks=("no:dataloading",),
           hand=False),
    Config("dl-apply", "--dataloading-apply", "no-dataloading",
           options={"dataloading": {"apply": True}}, hand=False),
    Config("dl-preload", "--dataloading-preload", "no-dataloading",
           options={"dataloading": {"preload": True}}, hand=False),
    Config("anomaly", "--detect-anomaly", "baseline", anomaly=True),
    Config("fused-optimizer", "-p fused-optimizer", "baseline", callbacks=("fused-optimizer",)),
)}

#: Why a cell is "—" (printed under the table).
NO_EQUIVALENT = {
    "dataloading": "the dataloading callback is ptrain's start-up check (and rebuild) of the "
                   "DataLoaders; a hand loop and Lightning use their DataLoaders as written "
                   "(Lightning's own num_workers warning is always on, part of its baseline), "
                   "and neither has an apply or preload switch",
    "checkpointing-mlp": "the MLP has no repeated block: nothing for a hand loop or Lightning "
                         "to checkpoint (ptrain's auto finds none either: see the row)",
}


def has_equivalent(work: Workload, config: Config) -> tuple[bool, str | None]:
    """Whether the hand loop and Lightning run ``config`` on ``work``, and if not, why."""
    if not config.hand:
        return False, "dataloading"
    if config.key == "checkpointing" and work.blocks is None:
        return False, "checkpointing-mlp"
    return True, None


# ---------------------------------------------------------------------------------------------
# Timing: the end of every training step, in every runner.


class StepTimer:
    """Host time at the end of each training step, its epoch and batch index, and whether
    ``torch.profiler`` was recording at the step's start or end. Also a ptrain callback."""

    name = "speed-toolkit-timer"

    def __init__(self, sync: Callable[[], None] | None):
        self.sync = sync
        self.ends: list[tuple[int, int, float, bool]] = []
        self.last_loss: torch.Tensor | None = None
        self._profiled = False

    def start(self) -> None:
        self._profiled = torch.autograd._profiler_enabled()

    def end(self, epoch: int, batch_idx: int, loss: torch.Tensor) -> None:
        if self.sync is not None:
            self.sync()
        profiled = self._profiled or torch.autograd._profiler_enabled()
        self.ends.append((epoch, batch_idx, time.perf_counter(), profiled))
        self.last_loss, self._profiled = loss, False

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch_idx, loss) -> None:
        self.end(trainer.current_epoch, batch_idx, loss)  # before the profiler's (trylast) hook

    def steady(self, warmup: int, batches: int) -> list[tuple[float, bool]]:
        """(seconds, profiled) of the steps after ``warmup``, except each epoch's first and
        last step."""
        out = []
        for (e0, b0, t0, _), (e1, b1, t1, profiled) in zip(self.ends, self.ends[1:]):
            if e1 == e0 and b1 == b0 + 1 and e1 * batches + b1 >= warmup and b1 < batches - 1:
                out.append((t1 - t0, profiled))
        return out


# ---------------------------------------------------------------------------------------------
# Runners: each prepares one fit (untimed) and returns what to time.


@dataclass
class Arm:
    """What one process measures."""
    work: Workload
    config: Config
    runner: str
    device: str
    threads: int
    root: Path


@dataclass
class Prepared:
    fit: Callable[[], Any]
    net: nn.Module
    report: Callable[[], str | None] = lambda: None  # what the plugin under test did


def plugin_report(trainer: ptrain.Trainer, config: Config) -> str | None:
    """One line on what the ptrain plugin of ``config`` did in this fit, from its own
    counters: the check that each arm did what its row says."""
    plugins = trainer.plugins
    if config.compiled:
        return plugins["compile"].summary()
    if config.key == "profiler":
        first, *rest = plugins["profiler"].summary().splitlines()
        timing = [line for line in rest if line.startswith("Step time")]
        return " ".join([first.split(";")[0] + ";", *timing])  # the trace folder is temporary
    if config.key == "checkpointing":
        return f"checkpointed: {', '.join(plugins['activation-checkpointing'].checkpointed)}"
    if config.key in ("dl-apply", "dl-preload"):
        return "; ".join(
            f"{stage}: suggested workers {r['suggested_workers']}, changes {r['changes'] or 'none'}"
            f", preloaded {r.get('preload_bytes', 0)} B" for stage, r in
            plugins["dataloading"].report.items())
    return None


def profiler_schedule(work: Workload):
    """ptrain's defaults (wait 1, warmup 1, active 3, one cycle), after the warm-up steps."""
    return torch.profiler.schedule(skip_first=work.warmup, wait=1, warmup=1, active=3, repeat=1)


def profiler_activities(device: torch.device) -> list:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def prepare_ptrain(arm: Arm, module: ptrain.TrainModule, timer: StepTimer) -> Prepared:
    config = arm.config
    options = {name: dict(values) for name, values in config.options.items()}
    if config.key == "profiler":
        options["profiler"] = {"skip_first": arm.work.warmup}
    trainer = ptrain.Trainer(
        accelerator=arm.device, precision=arm.work.precision, max_epochs=arm.work.epochs,
        seed=arm.work.seed, default_root_dir=str(arm.root), detect_anomaly=config.anomaly,
        callbacks=[timer, *config.callbacks], plugin_options=options or None)
    return Prepared(lambda: trainer.fit(module), module.net,
                    lambda: plugin_report(trainer, config))


def checkpoint_by_hand(blocks: list[nn.Module]) -> None:
    """What a user writes: each block's forward under non-reentrant ``torch.utils.checkpoint``."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        def forward(*args, _forward=block.forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)
        block.forward = forward


def fused_by_hand(setup: Any) -> Any:
    """What a user writes for the fused-optimizer row: the optimizer made with ``fused=True``
    (set in its param groups as the constructor sets it, so the schedulers stay bound)."""
    optimizer, _ = split_optimizers(setup)
    for settings in (optimizer.defaults, *optimizer.param_groups):
        settings["fused"], settings["foreach"] = True, False
    optimizer._step_supports_amp_scaling = True
    return setup


def split_optimizers(setup: Any) -> tuple[torch.optim.Optimizer, list[Any]]:
    """The optimizer and the per-epoch schedulers of the two forms the workloads return."""
    if isinstance(setup, torch.optim.Optimizer):
        return setup, []
    scheduler = setup["lr_scheduler"]
    assert scheduler.get("interval") == "epoch", scheduler
    return setup["optimizer"], [scheduler["scheduler"]]


def hand_loop(net: nn.Module, step_loss: Callable, optimizer: torch.optim.Optimizer,
              schedulers: list, train: DataLoader, val: DataLoader | None, epochs: int,
              device: torch.device, timer: StepTimer, after_step: Callable[[], None]) -> None:
    """The plain loop: forward + loss, backward, optimizer step, zero_grad; validation and the
    per-epoch schedulers after each epoch."""
    for epoch in range(epochs):
        net.train()
        for batch_idx, (x, y) in enumerate(train):
            x, y = x.to(device), y.to(device)
            loss = step_loss(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            timer.end(epoch, batch_idx, loss)
            after_step()
        if val is not None:
            net.eval()
            with torch.no_grad():
                for x, y in val:
                    logits = net(x.to(device))
                    nn.functional.cross_entropy(logits, y.to(device))
                    (logits.argmax(dim=1) == y.to(device)).float().mean()
        for scheduler in schedulers:
            scheduler.step()


def prepare_hand(arm: Arm, module: ptrain.TrainModule, timer: StepTimer) -> Prepared:
    key, work, device = arm.config.key, arm.work, torch.device(arm.device)
    net = module.net.to(device)
    if key == "checkpointing":
        checkpoint_by_hand(work.blocks(net))

    def step_loss(x, y):
        return nn.functional.cross_entropy(net(x), y)

    if arm.config.compiled:
        mode = COMPILE_MODE[key]
        step_loss = torch.compile(step_loss, mode=None if mode == "default" else mode)
    setup = module.configure_optimizers()
    if key == "fused-optimizer":
        fused_by_hand(setup)
    optimizer, schedulers = split_optimizers(setup)
    train, val = module.train_dataloader(), module.val_dataloader()
    prof = None
    if key == "profiler":
        prof = torch.profiler.profile(
            activities=profiler_activities(device), schedule=profiler_schedule(work),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(arm.root / "profiler")))

    def fit() -> None:
        seed_everything(work.seed)
        anomaly = (torch.autograd.detect_anomaly(check_nan=True) if arm.config.anomaly
                   else contextlib.nullcontext())
        with anomaly:
            if prof is not None:
                prof.start()
            hand_loop(net, step_loss, optimizer, schedulers, train, val, work.epochs, device,
                      timer, prof.step if prof is not None else _nothing)
            if prof is not None:
                prof.stop()
                if prof.profiler is not None:
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))

    return Prepared(fit, net)


def _nothing() -> None:
    pass


def lightning_twin(module: ptrain.TrainModule, work: Workload, checkpointed: bool,
                   fused: bool = False):
    """A LightningModule that trains ``module``'s net the way ``module`` does (same optimizer
    set-up, data, logging); ``forward`` is the net, so compiling the twin compiles the net."""
    import lightning

    class Twin(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x):
            return self.inner.net(x)

        def configure_model(self):
            if checkpointed:
                checkpoint_by_hand(work.blocks(self.inner.net))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            if work.logs:
                self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            setup = self.inner.configure_optimizers()
            return fused_by_hand(setup) if fused else setup

        def train_dataloader(self):
            return self.inner.train_dataloader()

    class ValidatingTwin(Twin):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.log("val_loss", nn.functional.cross_entropy(logits, y))
            self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)

        def val_dataloader(self):
            return self.inner.val_dataloader()

    return ValidatingTwin() if work.validates else Twin()


def prepare_lightning(arm: Arm, module: ptrain.TrainModule, timer: StepTimer) -> Prepared:
    import lightning
    from lightning.pytorch.profilers import PyTorchProfiler

    key, work = arm.config.key, arm.work

    class Timer(lightning.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            timer.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            timer.end(trainer.current_epoch, batch_idx, outputs["loss"])

    model = lightning_twin(module, work, checkpointed=key == "checkpointing",
                           fused=key == "fused-optimizer")
    if arm.config.compiled:
        mode = COMPILE_MODE[key]
        model = torch.compile(model, mode=None if mode == "default" else mode)
    extra: dict[str, Any] = {}
    if key == "profiler":
        extra["profiler"] = PyTorchProfiler(dirpath=str(arm.root / "profiler"), filename="prof",
                                            schedule=profiler_schedule(work))
    with quiet():  # its defaults, less the sanity-check validation the other runners don't do
        trainer = lightning.Trainer(
            accelerator="gpu" if arm.device == "cuda" else "cpu", devices=1,
            max_epochs=work.epochs, precision=work.precision, default_root_dir=str(arm.root),
            num_sanity_val_steps=0, detect_anomaly=arm.config.anomaly, callbacks=[Timer()],
            **extra)

    def fit() -> None:
        seed_everything(work.seed)
        trainer.fit(model)

    return Prepared(fit, module.net)


PREPARE = {"ptrain": prepare_ptrain, "hand": prepare_hand, "lightning": prepare_lightning}


# ---------------------------------------------------------------------------------------------
# One measurement, in a fresh process.


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def reset_peak_rss() -> int:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS; returns that, in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def measure(arm: Arm) -> dict[str, Any]:
    """One fit of ``arm``: its step times, fit wall time, memory and final loss."""
    torch.set_num_threads(arm.threads)
    device = torch.device(arm.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.zeros(1, device=device)  # the CUDA context is not the fit's memory
    module = arm.work.build(arm.work)
    batches = len(module.train_dataloader())
    timer = StepTimer(torch.cuda.synchronize if cuda else None)
    prepared = PREPARE[arm.runner](arm, module, timer)
    gc.collect()
    rss_before = reset_peak_rss()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with quiet():
        start = time.perf_counter()
        prepared.fit()
        fit_s = time.perf_counter() - start
    result = {
        "fit_s": fit_s,
        "rss_growth": _status_kib("VmHWM") * 1024 - rss_before,
        "cuda_peak": torch.cuda.max_memory_allocated(device) if cuda else None,
        "steps": timer.steady(arm.work.warmup, batches),
        "loss": float(timer.last_loss),
        "activations": None,
        "report": prepared.report(),
    }
    if not arm.config.compiled:  # compiled kernels allocate out of the dispatcher's sight
        loader = module.train_dataloader()
        x, y = next(iter(DataLoader(loader.dataset, batch_size=loader.batch_size)))
        net = prepared.net.to(device).train()  # as in a training step, dropout included
        result["activations"] = activation_memory(net, x.to(device), y.to(device))
    usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in usage)
    return result


def child_main(arm: Arm, conn, log_path: str) -> None:
    """Entry point of a measuring process: its output goes to ``log_path``, its result (or the
    error) back through ``conn``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        conn.send(("ok", measure(arm)))
    except BaseException as exc:  # reported in the table: nothing is skipped silently
        traceback.print_exc()  # the whole story stays in the log; the table gets its first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        conn.send(("error", f"{type(exc).__name__}: {first}"))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()


#: Imported by the fork server before it forks the measuring processes, so that they measure no
#: imports: everything any arm imports (Lightning only on the CPU: on CUDA each Lightning process
#: imports it itself, since a library that queries the CUDA driver at import time would make the
#: server's children unable to use CUDA).
PRELOAD = ["__main__", "torch._dynamo", "torch._inductor.compile_fx", "torch.profiler",
           "torch.utils.checkpoint", "torch.utils.tensorboard", "ptrain_compile",
           "ptrain_profiler", "ptrain_activation_checkpointing", "ptrain.examples.digits",
           "sklearn.datasets"]
LIGHTNING_PRELOAD = ["lightning", "lightning.pytorch.profilers"]


def process_context(device: str, with_lightning: bool):
    """A fork server: a fresh process (CUDA untouched) that imports the libraries once and
    forks one process per measurement."""
    if device == "cuda":  # a CUDA availability check in the server must not init the driver
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    ctx = multiprocessing.get_context("forkserver")
    lightning = LIGHTNING_PRELOAD if with_lightning and device == "cpu" else []
    ctx.set_forkserver_preload(PRELOAD + lightning)
    return ctx


def run_arm(ctx, arm: Arm, log_path: Path, timeout_s: float) -> dict[str, Any]:
    """Measure ``arm`` in a process forked by the fork server; its result, or
    ``{"error": ...}``."""
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_main, args=(arm, send, str(log_path)), daemon=True)
    proc.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            proc.kill()
            return {"error": f"no result after {timeout_s:.0f} s (killed)"}
        status, payload = receive.recv()
    except EOFError:
        proc.join()
        tail = log_path.read_text(errors="replace")[-600:] if log_path.exists() else ""
        return {"error": f"the process died (exit code {proc.exitcode}): {tail}"}
    finally:
        proc.join(timeout=60)
        receive.close()
    return payload if status == "ok" else {"error": payload}


# ---------------------------------------------------------------------------------------------
# Aggregating and printing


@dataclass
class Cell:
    """One runner's figures on one row."""
    status: str = ""                 # "" when measured, else what to print instead
    steps: list[float] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)
    fit_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    activations: tuple[int, int] | None = None
    error: str | None = None
    report: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.steps)

    def quartiles(self) -> tuple[float, float]:
        if len(self.steps) < 2:
            return self.steps[0], self.steps[0]
        q = statistics.quantiles(self.steps, n=4)
        return q[0], q[2]


def ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.3f}" if value < 10 else f"{value:.2f}"


def cell_for(results: list[dict], kind: str) -> Cell:
    """``kind``: "all" steps, or the profiler's "recorded" / "other" steps."""
    cell = Cell()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        cell.status, cell.error = "error", errors[0]
        return cell
    for r in results:
        cell.steps += [s for s, profiled in r["steps"]
                       if kind == "all" or profiled == (kind == "recorded")]
        cell.memory.append(r["cuda_peak"] if r["cuda_peak"] is not None else r["rss_growth"])
        cell.fit_s.append(r["fit_s"])
        cell.losses.append(r["loss"])
        cell.activations = r["activations"]
        cell.report = cell.report or r["report"]
    if not cell.steps:
        cell.status = "no steps"
    return cell


@dataclass
class Row:
    work: Workload
    config: Config
    label: str
    kind: str
    cells: dict[str, Cell]
    reason: str | None = None        # why the hand loop and Lightning show "—"


def build_rows(work: Workload, results: dict, configs: list[str], quick: bool,
               with_lightning: bool) -> list[Row]:
    rows = []
    for config in (CONFIGS[key] for key in configs):
        kinds = [("recorded", ": recorded steps"), ("other", ": other steps")] \
            if config.key == "profiler" else [("all", "")]
        equivalent, reason = has_equivalent(work, config)
        for kind, suffix in kinds:
            cells = {}
            for runner in RUNNERS:
                if runner != "ptrain" and not equivalent:
                    cells[runner] = Cell(status="—")
                elif runner == "lightning" and not with_lightning:
                    cells[runner] = Cell(status="not installed" if not HAVE_LIGHTNING
                                         else "not run (--no-lightning)")
                elif quick and runner not in config.quick:
                    cells[runner] = Cell(status="not run (--quick)")
                else:
                    cells[runner] = cell_for(results[(config.key, runner)], kind)
            rows.append(Row(work, config, config.label + suffix, kind, cells, reason))
    return rows


def reference(rows: list[Row], row: Row) -> Row | None:
    if row.config.ref is None:
        return None
    return next(r for r in rows if r.work is row.work and r.config.key == row.config.ref)


def hand_reference(rows: list[Row], row: Row) -> Cell:
    """The hand loop's cell that did the same work as ``row`` (its own, or the plain loop's)."""
    if row.cells["hand"].status == "—":
        return next(r for r in rows if r.work is row.work
                    and r.config.key == "baseline").cells["hand"]
    return row.cells["hand"]


def time_cell(cell: Cell) -> str:
    if cell.status:
        return cell.status
    low, high = cell.quartiles()
    return f"{ms(cell.median)} [{ms(low)}–{ms(high)}]"


def ratio_cell(cell: Cell, ref: Cell | None) -> str:
    if cell.status or ref is None or ref.status:
        return ""
    return f"×{cell.median / ref.median:.2f}"


def memory_cell(cell: Cell) -> str:
    if cell.status:
        return ""
    return f"{statistics.median(cell.memory) / MiB:.1f}"


def activations_cell(row: Row) -> str:
    values = {runner: c.activations for runner, c in row.cells.items()
              if not c.status and c.activations is not None}
    if row.config.compiled:
        return "n/a (compiled)"
    if not values:
        return ""
    def mib(pair: tuple[int, int]) -> str:
        return f"{pair[0] / MiB:.2f} / {pair[1] / MiB:.2f}"

    if len(set(values.values())) == 1:
        return mib(next(iter(values.values())))
    return "differ: " + ", ".join(f"{runner} {mib(v)}" for runner, v in values.items())


def loss_cell(cell: Cell, hand: Cell, compiled: bool) -> str:
    if cell.status or hand.status or cell is hand:
        return ""
    diff = max(abs(a - b) for a, b in zip(cell.losses, hand.losses))
    if compiled:
        return f"{diff:.1e} (compiled)"
    return f"{diff:.1e}" + ("" if diff <= 1e-5 else " MISMATCH")


def main_table(rows: list[Row], device: str) -> str:
    memory = "CUDA peak MiB" if device == "cuda" else "RSS+ MiB"
    header = ["workload", "configuration", "vs row", "activations MiB (held / peak)"]
    for runner in RUNNERS:
        header += [f"{runner} ms/step [IQR]", f"{runner} ×", f"{runner} {memory}"]
    header += ["|Δloss| ptrain−hand", "|Δloss| lightning−hand"]
    lines = []
    for row in rows:
        ref = reference(rows, row)
        out = [row.work.key, row.label, ref.label if ref else "", activations_cell(row)]
        for runner in RUNNERS:
            cell = row.cells[runner]
            out += [time_cell(cell), ratio_cell(cell, ref.cells[runner] if ref else None),
                    memory_cell(cell)]
        hand = hand_reference(rows, row)
        out += [loss_cell(row.cells["ptrain"], hand, row.config.compiled),
                loss_cell(row.cells["lightning"], hand, row.config.compiled)]
        lines.append(out)
    return markdown_table(header, lines)


def fit_table(rows: list[Row]) -> str:
    lines = []
    for row in rows:
        if row.kind == "other":
            continue  # the same fits as the recorded-steps row
        out = [row.work.key, row.label.removesuffix(": recorded steps")]
        for runner in RUNNERS:
            cell = row.cells[runner]
            out.append(cell.status or f"{statistics.median(cell.fit_s):.2f}")
        lines.append(out)
    return markdown_table(["workload", "configuration", *(f"{r} fit s" for r in RUNNERS)], lines)


def notes(rows: list[Row]) -> list[str]:
    out = []
    reasons = {row.reason for row in rows if row.reason}
    for reason in sorted(reasons):
        out.append(f"— ({reason}): {NO_EQUIVALENT[reason]}.")
    for row in rows:
        for runner, cell in row.cells.items():
            if cell.error and row.kind != "other":
                out.append(f"{row.work.key}, {row.label}, {runner}: {cell.error}")
    for row in rows:
        report = row.cells["ptrain"].report
        if report and row.kind != "other":
            label = row.label.removesuffix(": recorded steps")
            out.append(f"{row.work.key}, {label}, the plugin's own report (first repeat): {report}")
    return out


# ---------------------------------------------------------------------------------------------
# Main


def arms_of(work: Workload, configs: list[str], quick: bool,
            with_lightning: bool) -> list[tuple[str, str]]:
    arms = []
    for config in (CONFIGS[key] for key in configs):
        equivalent, _ = has_equivalent(work, config)
        for runner in RUNNERS:
            if quick and runner not in config.quick:
                continue
            if runner != "ptrain" and not equivalent:
                continue
            if runner == "lightning" and not with_lightning:
                continue
            arms.append((config.key, runner))
    return arms


class Load(CpuLoad):
    """How busy other processes kept the CPUs: :class:`CpuLoad` counts this process and its
    reaped children as its own; the measuring processes are the fork server's children, so the
    CPU seconds they report are added here."""

    measured_s = 0.0  # CPU seconds of all measuring processes so far

    def _sample(self):
        sample = super()._sample()
        return None if sample is None else (sample[0], sample[1], sample[2] + Load.measured_s)


def run_workload(ctx, work: Workload, args: argparse.Namespace, scratch: Path,
                 with_lightning: bool) -> dict:
    arms = arms_of(work, args.configs, args.quick, with_lightning)
    results: dict[tuple[str, str], list[dict]] = {arm: [] for arm in arms}
    failed: set[tuple[str, str]] = set()
    for repeat in range(args.repeats):
        shift = repeat % len(arms)
        for key, runner in arms[shift:] + arms[:shift]:
            if (key, runner) in failed:  # a failure is deterministic: report it once
                continue
            root = scratch / f"{work.key}-{key}-{runner}-{repeat}"
            root.mkdir()
            arm = Arm(work, CONFIGS[key], runner, args.device, args.threads, root)
            start = time.perf_counter()
            result = run_arm(ctx, arm, root / "output.log", args.timeout)
            Load.measured_s += result.get("cpu_s", 0.0)
            results[(key, runner)].append(result)
            if "error" in result:
                failed.add((key, runner))
            status = "error" if "error" in result else "ok"
            print(f"[{work.key} {repeat + 1}/{args.repeats}] {runner:<9} "
                  f"{CONFIGS[key].label:<55} {status} ({time.perf_counter() - start:.1f} s)",
                  file=sys.stderr, flush=True)
    return results


def machine_line() -> str:
    cpu = cpu_name()
    lightning = (importlib.metadata.version("lightning") if HAVE_LIGHTNING
                 else "not installed")
    return (f"{os.cpu_count()} CPU cores ({cpu}); Python {sys.version.split()[0]}; torch "
            f"{torch.__version__}; lightning {lightning}; ptrain at {source_revision()}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 digits epochs, 25 transformer steps, 1 repeat, no max-autotune "
                             "row: a smoke check, not figures to publish")
    parser.add_argument("--workload", choices=("all", "digits", "transformer"), default="all")
    parser.add_argument("--repeats", type=int,
                        help="fits per arm (default 3; 1 with --quick)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads in each measuring process (default 1)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated rows to run (default all: {','.join(CONFIGS)}); "
                             f"baseline, and no-dataloading for the dataloading rows, are added "
                             f"since the others are compared with them")
    parser.add_argument("--no-lightning", action="store_true", help="leave Lightning out")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one measuring process may take before it is killed")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    chosen = {name.strip() for name in args.configs.split(",") if name.strip()}
    unknown = sorted(chosen - set(CONFIGS))
    if unknown:
        parser.error(f"unknown --configs {', '.join(unknown)}; valid: {', '.join(CONFIGS)}")
    for key in list(chosen):
        ref = CONFIGS[key].ref
        while ref is not None:
            chosen.add(ref)
            ref = CONFIGS[ref].ref
    args.configs = [key for key in CONFIGS if key in chosen]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_at_start = os.getloadavg()
    if args.device == "cuda" and not torch.cuda.is_available():  # this process never forks
        print(f"--device cuda: torch {torch.__version__} sees no CUDA device here; run on a "
              f"machine with one, or use --device cpu.", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    with_lightning = HAVE_LIGHTNING and not args.no_lightning
    ctx = process_context(args.device, with_lightning)
    chosen = [w.quick() if args.quick else w for w in workloads().values()
              if args.workload in ("all", w.key)]
    print(f"# Speed-toolkit plugins: each off and on, ptrain / hand-written loop / Lightning\n\n"
          f"{machine_line()}\n\nDevice {args.device}; {args.threads} intra-op thread(s) per "
          f"measuring process; {args.repeats} repeat(s); load average at start "
          f"{load_at_start[0]:.2f} / {load_at_start[1]:.2f} / {load_at_start[2]:.2f} "
          f"(1 / 5 / 15 min){'; --quick' if args.quick else ''}.\n")
    if not HAVE_LIGHTNING:
        print("lightning is not installed: its columns say so.\n")
    rows: list[Row] = []
    busy = []
    with tempfile.TemporaryDirectory(prefix="ptrain-speed-") as scratch:
        for work in chosen:
            load = Load()
            results = run_workload(ctx, work, args, Path(scratch), with_lightning)
            rows += build_rows(work, results, args.configs, args.quick, with_lightning)
            others = load.others_percent()
            if others is not None:
                busy.append(f"{work.key}: {others:.0f}%")
    for work in chosen:
        steps = (f"{work.epochs} epochs, steps from {work.warmup} on" if work.key == "digits"
                 else f"{work.steps} steps, from step {work.warmup} on")
        print(f"- {work.key}: {work.title}; {steps}")
    print("\n" + main_table(rows, args.device) + "\n")
    print("Whole fit (set-up inside fit, warm-up, compilation, validation, end of run), "
          "median seconds:\n\n" + fit_table(rows) + "\n")
    for line in notes(rows):
        print(f"- {line}")
    print(f"\nOther processes kept the CPUs busy: {', '.join(busy) or 'unknown'}. Load average "
          f"at the end {os.getloadavg()[0]:.2f}. Wall time {time.perf_counter() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
