"""Each strategy on the small transformer, side by side: global throughput, time per step, what a
rank holds (parameters, gradients, optimizer state) and the final loss.

    .venv/bin/python benchmarks/strategies.py                 # about 2-3 minutes on 2 CPU cores
    .venv/bin/python benchmarks/strategies.py --steps 60      # shorter
    .venv/bin/python benchmarks/strategies.py --only ddp,zero3 --no-lightning
    .venv/bin/python benchmarks/strategies.py --repeats 2     # best of 2: less noise, twice as long

What runs: the transformer of ``benchmarks/overhead.py`` (embedding with learned positions, 2-layer
encoder, d_model 64, 4 heads, sequence 32, mean pooling, 10 classes; AdamW lr 1e-3) on the
learnable counting task of ``benchmarks/precision.py``, for ``--steps`` optimizer steps from the
same initial weights (``torch.manual_seed(0)`` before building it) on the same global batches:

- ``single-device``: ``ptrain.Trainer(strategy="single-device")``, 1 process, batch 2B;
- ``ddp``, ``zero1``, ``zero2``, ``zero3``, ``fsdp``: ``ptrain.Trainer(strategy=NAME,
  devices=2, accelerator="cpu")``, 2 processes started by the strategy (torch's elastic
  launcher), gloo, batch B per rank. The strategy gives each rank its shard of the data with a
  ``DistributedSampler`` (no shuffling), so rank r's k-th batch holds samples 2(kB + j) + r and the
  two ranks together see exactly the single-device run's k-th batch of 2B;
- ``hand-written DDP``: ``torch.multiprocessing.start_processes`` (spawn) of 2 processes, each
  ``init_process_group("gloo")``, ``DistributedDataParallel(model)``, a ``DistributedSampler``
  loader of batch B, and ``loss.backward(); optimizer.step(); optimizer.zero_grad()``;
- ``lightning ddp``: ``lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2)`` with
  progress bar, checkpointing, logger, model summary and sanity check off (Lightning starts rank 1
  by running this script again). Its loader brings its own ``DistributedSampler(shuffle=False)``
  and ``use_distributed_sampler=False`` is set: the sampler Lightning inserts shuffles training
  data even when the loader does not, which would give it other batches than the rest. Skipped
  when ``lightning`` can't be imported; reported with its error when it fails.

Every configuration runs in a child process of its own (its workers are that child's children),
so no process group, thread setting or allocator state carries over from one to the next. Each
process uses ``--threads`` intra-op threads (default 1, as in the other benchmarks: on a shared
2-core machine, 2 OpenMP threads in one process slow down by an order of magnitude as soon as
another process takes a core, so a single-device run with 2 threads measures the neighbours).
How busy other processes kept the CPUs during each configuration (from ``/proc/stat``) is
printed with it.

Measured on every rank, written to a JSON file per rank in a temporary folder and read back here:

- time: ``perf_counter`` at the end of every step (ptrain's ``on_train_batch_end``, Lightning's
  ``on_train_batch_end``, after ``zero_grad`` in the hand-written loop); timed = from the end of
  step ``--warmup`` to the end of the last step. Time per step = the slowest rank's timed span /
  timed steps; samples/s = global batch (2B) x timed steps / that span. "run s" is the child's
  whole wall time: imports, launching the workers, set-up, training, tear-down;
- per-rank bytes: ``ptrain.distributed.held_bytes(model, optimizers)`` at the second optimizer
  step (``on_before_optimizer_step``: the gradients are there, and Adam's state exists after the
  first step), on the model as the strategy wrapped it. Of a DTensor only the local shard
  counts; of a ``ZeroRedundancyOptimizer`` only its own partition's state;
- final loss: the mean training loss of the last 20 steps, averaged over the ranks (each rank's
  loss is the mean over its B samples, so this is the mean over the 2B samples of the global
  batch, as in the single-device run); max loss diff: the largest difference, over all steps,
  between a step's loss (mean over the ranks) and single-device's. All runs see the same global
  batches from the same weights, so it is float rounding (which Adam lets grow to ~1e-4 over a
  few hundred steps) unless a strategy trains differently.

``--repeats N`` runs every configuration N times, in an order that rotates from repeat to repeat,
and reports the run with the highest throughput (noise only ever adds time).

On a 2-core CPU the two processes of a 2-process run take both cores (with 1 thread each), and
share them with the launcher, gloo's threads and each other: the throughput figures show what the
strategies cost (communication, sharding, launching), not the speed-up that several GPUs give.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

import ptrain
from ptrain.distributed import held_bytes

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from overhead import CpuLoad, TinyTransformer, source_revision  # noqa: E402  (through HERE)
from precision import counting_task  # noqa: E402

LAST_STEPS = 20
PTRAIN_STRATEGIES = ("single-device", "ddp", "zero1", "zero2", "zero3", "fsdp")
HAND = "hand-written DDP"
LIGHTNING = "lightning ddp"
CONFIGS = {name: 1 if name == "single-device" else 2 for name in PTRAIN_STRATEGIES}
CONFIGS.update({HAND: 2, LIGHTNING: 2})


# ---------------------------------------------------------------------------------------------
# What every rank records


def write_rank_file(out_dir: str, rank: int, world_size: int, times: list[float], losses: list,
                    held: dict | None) -> None:
    record = {"rank": rank, "world_size": world_size, "times": times,
              "losses": torch.stack([loss.detach().float() for loss in losses]).tolist(),
              "held": held, "threads": torch.get_num_threads()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


class StepRecorder:
    """A ptrain callback plugin (an object given in ``callbacks=[...]``, pickled to the workers):
    per-step times and losses, ``held_bytes`` at the second optimizer step, one file per rank."""

    name = "step-recorder"

    def __init__(self, out_dir: str, threads: int):
        self.out_dir, self.threads = out_dir, threads
        self.times: list[float] = []
        self.losses: list = []
        self.held: dict | None = None

    @ptrain.hookimpl
    def setup(self, trainer, stage):
        torch.set_num_threads(self.threads)

    @ptrain.hookimpl
    def on_before_optimizer_step(self, trainer, optimizer):
        if trainer.global_step == 1:
            self.held = held_bytes(trainer.model, trainer.optimizers)

    @ptrain.hookimpl
    def on_train_batch_end(self, loss):
        self.times.append(time.perf_counter())
        self.losses.append(loss.detach())

    @ptrain.hookimpl
    def teardown(self, trainer, stage):
        if self.times:
            write_rank_file(self.out_dir, trainer.global_rank, trainer.world_size, self.times,
                            self.losses, self.held)


class PtrainTransformer(ptrain.TrainModule):
    """The transformer as a ptrain module (module level: it is pickled to the workers)."""

    def __init__(self, data, batch_size: int):
        super().__init__()
        self.net = build_net()
        self.data, self.batch_size = data, batch_size

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        return nn.functional.cross_entropy(self.net(tokens), labels)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


# ---------------------------------------------------------------------------------------------
# The runs (inside a child process)


def make_data(global_batch: int, steps: int):
    return counting_task(global_batch * steps, torch.Generator().manual_seed(0))


def build_net():
    torch.manual_seed(0)
    return TinyTransformer()


def run_ptrain(strategy: str, args: argparse.Namespace, out_dir: str) -> None:
    processes = CONFIGS[strategy]
    torch.set_num_threads(args.threads)
    module = PtrainTransformer(make_data(2 * args.batch, args.steps), 2 * args.batch // processes)
    trainer = ptrain.Trainer(
        accelerator="cpu", strategy=strategy, devices=processes, max_steps=args.steps, seed=0,
        default_root_dir=os.path.join(out_dir, "runs"),  # removed with out_dir
        callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint",
                   StepRecorder(out_dir, args.threads)])
    trainer.fit(module)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand_worker(rank: int, world_size: int, port: int, args: argparse.Namespace,
                out_dir: str) -> None:
    """One rank of the hand-written DistributedDataParallel loop."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        model = DistributedDataParallel(build_net())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = make_data(2 * args.batch, args.steps)
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
        loader = DataLoader(data, batch_size=2 * args.batch // world_size, sampler=sampler)
        model.train()
        times, losses, held = [], [], None
        for step, (tokens, labels) in enumerate(loader):
            if step == args.steps:
                break
            loss = nn.functional.cross_entropy(model(tokens), labels)
            loss.backward()
            if step == 1:
                held = held_bytes(model, [optimizer])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter())
            losses.append(loss.detach())
        write_rank_file(out_dir, rank, world_size, times, losses, held)
        dist.barrier()  # leave together: gloo aborts a process whose peer tore down first
    finally:
        dist.destroy_process_group()


def run_hand(args: argparse.Namespace, out_dir: str) -> None:
    import torch.multiprocessing as mp

    world_size = CONFIGS[HAND]
    mp.start_processes(hand_worker, args=(world_size, _free_port(), args, out_dir),
                       nprocs=world_size, start_method="spawn")


def run_lightning(args: argparse.Namespace, out_dir: str) -> None:
    import warnings

    import lightning
    from torch.utils.data import DistributedSampler

    warnings.filterwarnings("ignore")
    processes = CONFIGS[LIGHTNING]
    torch.set_num_threads(args.threads)
    data = make_data(2 * args.batch, args.steps)

    class Transformer(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = build_net()

        def training_step(self, batch, batch_idx):
            tokens, labels = batch
            return nn.functional.cross_entropy(self.net(tokens), labels)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            # Lightning's own DistributedSampler shuffles training data whatever the loader's
            # sampler; this one keeps the order of the other runs (use_distributed_sampler=False)
            sampler = DistributedSampler(data, num_replicas=self.trainer.world_size,
                                         rank=self.trainer.global_rank, shuffle=False)
            return DataLoader(data, batch_size=2 * args.batch // processes, sampler=sampler)

    class Recorder(lightning.Callback):
        def __init__(self):
            self.times, self.losses, self.held = [], [], None

        def setup(self, trainer, pl_module, stage):
            torch.set_num_threads(args.threads)  # Lightning may have set its own by now

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if trainer.global_step == 1:
                self.held = held_bytes(trainer.model, [optimizer])

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.times.append(time.perf_counter())
            self.losses.append(outputs["loss"].detach())

        def on_train_end(self, trainer, pl_module):
            write_rank_file(out_dir, trainer.global_rank, trainer.world_size, self.times,
                            self.losses, self.held)

    trainer = lightning.Trainer(
        accelerator="cpu", strategy="ddp", devices=processes, max_steps=args.steps,
        max_epochs=1, enable_progress_bar=False, enable_checkpointing=False, logger=False,
        enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=False,
        callbacks=[Recorder()],
        default_root_dir=os.path.join(out_dir, "runs"))
    trainer.fit(Transformer())


def child(name: str, args: argparse.Namespace) -> None:
    out_dir = args.out
    if name in PTRAIN_STRATEGIES:
        run_ptrain(name, args, out_dir)
    elif name == HAND:
        run_hand(args, out_dir)
    elif name == LIGHTNING:
        run_lightning(args, out_dir)
    else:
        raise SystemExit(f"unknown configuration {name!r}")


# ---------------------------------------------------------------------------------------------
# The parent: one child per configuration, then the table


def run_config(name: str, args: argparse.Namespace) -> dict:
    processes = CONFIGS[name]
    with tempfile.TemporaryDirectory(prefix="ptrain-bench-ranks-") as out_dir, \
            tempfile.TemporaryFile(mode="w+") as log:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", out_dir,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch",
               str(args.batch), "--threads", str(args.threads)]
        load = CpuLoad()
        start = time.perf_counter()
        # a session of its own: on a time-out, the child and the workers it started go together
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)  # reaps it: its CPU time counts as ours
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"name": name, "processes": processes,
                    "error": f"timed out after {args.timeout} s (--timeout)"}
        wall = time.perf_counter() - start
        others = load.others_percent()
        records = []
        for path in sorted(Path(out_dir).glob("rank*.json")):
            records.append(json.loads(path.read_text()))
        log.seek(0)
        output = log.read()
    if code != 0 or len(records) != processes:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit code {code}"
        if args.verbose:
            print(output, file=sys.stderr)
        return {"name": name, "processes": processes,
                "error": f"failed (exit code {code}, {len(records)} rank files): {reason}"}
    return summarize(name, processes, records, wall, others, args)


def summarize(name: str, processes: int, records: list[dict], wall: float,
              others: float | None, args: argparse.Namespace) -> dict:
    warmup = args.warmup
    spans = [r["times"][-1] - r["times"][warmup - 1] for r in records]
    steps = [len(r["times"]) for r in records]
    timed = steps[0] - warmup
    span = max(spans)
    losses = [sum(r["losses"][-LAST_STEPS:]) / len(r["losses"][-LAST_STEPS:]) for r in records]
    step_losses = [sum(ranks) / len(ranks) for ranks in zip(*(r["losses"] for r in records))]
    return {"name": name, "processes": processes, "steps": steps[0],
            "samples_per_s": 2 * args.batch * timed / span, "ms_per_step": 1e3 * span / timed,
            "held": [r["held"] for r in records], "threads": records[0]["threads"],
            "final_loss": sum(losses) / len(losses), "step_losses": step_losses, "wall_s": wall,
            "others": others}


def best(attempts: list[dict]) -> dict:
    """The attempt with the highest throughput (noise only ever adds time), else the last error."""
    done = [a for a in attempts if "error" not in a]
    return max(done, key=lambda a: a["samples_per_s"]) if done else attempts[-1]


def _kib(values: list[int]) -> str:
    shown = [f"{v / 1024:.1f}" for v in values]
    return shown[0] if len(set(shown)) == 1 else " / ".join(shown)


def _loss_diff(result: dict, base: dict | None) -> str:
    """The largest difference, over the steps, between this run's loss (mean over its ranks) and
    single-device's: float rounding only (~1e-6) when both trained the same model the same way."""
    if base is None:
        return ""
    if result is base:
        return "-"
    diff = max(abs(a - b) for a, b in zip(result["step_losses"], base["step_losses"]))
    return f"{diff:.0e}" if diff < 1e-3 else f"{diff:.3f}"


def table(results: list[dict], batch: int) -> str:
    base = next((r for r in results if r["name"] == "single-device" and "error" not in r), None)
    rows = [("strategy", "processes", "batch/rank", "samples/s", "ms/step", "vs single",
             "params KiB/rank", "grads KiB/rank", "optim state KiB/rank", "total KiB/rank",
             "final loss", "max loss diff", "run s", "others' CPU")]
    for r in results:
        per_rank = f"{2 * batch // r['processes']}"
        if "error" in r:
            rows.append((r["name"], str(r["processes"]), per_rank, "failed: see below",
                         *["-"] * 10))
            continue
        held = r["held"]
        totals = [h["parameters"] + h["gradients"] + h["optimizer_state"] for h in held]
        rows.append((
            r["name"], str(r["processes"]), per_rank, f"{r['samples_per_s']:.0f}",
            f"{r['ms_per_step']:.1f}",
            f"{r['samples_per_s'] / base['samples_per_s']:.2f}x" if base else "",
            _kib([h["parameters"] for h in held]), _kib([h["gradients"] for h in held]),
            _kib([h["optimizer_state"] for h in held]), _kib(totals),
            f"{r['final_loss']:.4f}", _loss_diff(r, base), f"{r['wall_s']:.1f}",
            "?" if r["others"] is None else f"{r['others']:.0f}%"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=20,
                        help="steps left out of the timing (at least 2)")
    parser.add_argument("--batch", type=int, default=16,
                        help="B: batch per rank of the 2-process runs; the global batch is 2B")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads per process (default 1)")
    parser.add_argument("--only", help="comma-separated configurations to run (default: all): "
                        + ", ".join(CONFIGS))
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning's row")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each configuration; the fastest is reported (default 1)")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per configuration")
    parser.add_argument("--verbose", action="store_true",
                        help="print the whole output of a configuration that failed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup < 2 or args.steps < args.warmup + LAST_STEPS:
        parser.error(f"need --warmup >= 2 and --steps >= warmup + {LAST_STEPS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    import importlib.util

    names = list(CONFIGS)
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
        unknown = [n for n in names if n not in CONFIGS]
        if unknown:
            raise SystemExit(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
    have_lightning = importlib.util.find_spec("lightning") is not None
    skipped = []
    if LIGHTNING in names and (args.no_lightning or not have_lightning):
        names.remove(LIGHTNING)
        skipped.append(f"{LIGHTNING}: " + ("--no-lightning" if have_lightning
                                            else "lightning is not importable"))
    print(f"# strategy benchmark: small transformer, global batch {2 * args.batch} (2 x "
          f"{args.batch} on 2 processes), AdamW, {args.steps} steps ({args.warmup} warm-up), CPU, "
          f"gloo; torch {torch.__version__}, {os.cpu_count()} CPUs, intra-op threads per process: "
          f"{args.threads}; ptrain at {source_revision()}\n")
    start = time.perf_counter()
    attempts: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:  # each repeat starts elsewhere
            attempts[name].append(run_config(name, args))
            print(f"  done: {name} ({attempts[name][-1].get('wall_s', 0):.1f} s)",
                  file=sys.stderr, flush=True)
    results = [best(attempts[name]) for name in names]
    print(table(results, args.batch))
    for r in results:
        if "error" in r:
            print(f"\n{r['name']} {r['error']}")
    best_of = (f" (the best of {args.repeats} runs of each configuration, each in its own "
               f"process(es), in an order that rotates from repeat to repeat)"
               if args.repeats > 1 else "")
    print(f"\nsamples/s: global (all ranks), over the {args.steps - args.warmup} steps after the "
          f"warm-up{best_of}; ms/step: the slowest rank's; vs single: throughput against "
          f"single-device. KiB/rank: held_bytes at the second optimizer step (two values: rank 0 "
          f"/ rank 1). final loss: mean of the last {LAST_STEPS} steps, over the ranks; max loss "
          f"diff: the largest difference of a step's loss (mean over the ranks) to "
          f"single-device's: the same batches from the same weights, so float rounding (~1e-4 "
          f"after a few hundred Adam steps) unless a strategy trains differently. run s: "
          f"the whole configuration (imports, launch, set-up, training, tear-down). others' "
          f"CPU: how busy other processes kept the CPUs meanwhile (the main source of noise).")
    print(f"On {os.cpu_count()} CPU cores with {args.threads} thread(s) per process, the 2-process "
          f"runs take both cores, which they share with gloo's threads and anything else "
          f"running: the throughput shows the strategies' overhead (communication, sharding), "
          f"not the speed-up of one GPU per process.")
    for line in skipped:
        print(f"skipped: {line}")
    print(f"total: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
