"""How long training stalls for a checkpoint, written synchronously and in the background
(issue 38), on a model of 201 M parameters on the CPU: ptrain against a hand-written loop and
Lightning 2.6.6, in one run.

    .venv/bin/python benchmarks/checkpointing.py            # about 13 minutes on 2 cores
    .venv/bin/python benchmarks/checkpointing.py --no-fsdp  # one process only: 4 minutes
    .venv/bin/python benchmarks/checkpointing.py --quick    # a 17 M-parameter model: plumbing
    python benchmarks/checkpointing.py --device cuda --no-fsdp   # on a GPU (issue 39)
    .venv/bin/python benchmarks/checkpointing.py --only-fsdp --optimizer adam --steps 21
                                                     # fsdp's stall out of its noise: 16 min

The model: 12 ``Linear(4096, 4096)`` layers with ReLU between (201 M parameters, 805 MB in
float32), plain SGD (no optimizer state, so a checkpoint is the weights: 805 MB; with
``--optimizer adam``, the weights and Adam's two moments: 2.4 GB), batches of 8 made-up
samples. Each arm is a fresh process that trains ``--steps`` steps and takes a
checkpoint every ``--every`` steps, into a folder under ``--workdir``:

- ``hand``: ``torch.save`` to a temporary file, ``fsync``, rename (what ptrain's writer does);
  ``hand, async``: the same after a copy of the state dict, on a ``threading.Thread``, the next
  save joining the previous one (what a careful user writes);
- ``ptrain``: the default checkpoint callback (``last.ckpt`` every ``--every`` steps);
  ``ptrain, async``: the same with ``--checkpoint-async-save``;
- ``lightning``: ``ModelCheckpoint(every_n_train_steps=...)``; ``lightning, async``: with
  Lightning's ``AsyncCheckpointIO`` plugin;
- each runner once more without checkpoints: the baseline.

Figures, per save: **stall at the save** is the step that saves and the one after it, less two
median steps away from a save (what the loop waited for before training on, wherever a runner
counts it); **extra time per save** is the arm's whole
training time less its runner's baseline, over the number of saves (the stall plus whatever the
background write took from the steps around it: on 2 cores, the writing thread competes with
training); **CPU per save** is the CPU time the arm's process (all its threads: the writer's
too; rank 0's, for fsdp) used from a saving step to the step before the next save, less as
many median steps of the baseline's: what a save costs the host's cores, wherever it ran. A
background write hides its time from the steps only where a core is idle for it: on a host
whose cores training keeps busy, its CPU per save comes back as extra time. Step times are
taken on the host after each step (the CPU has no asynchronous device).

The same model sharded over 2 processes (``fsdp``, gloo, one intra-op thread each: the two
cores are the two ranks', and a background write competes with them), each checkpoint a sharded
folder of torch.distributed.checkpoint, rank 0's steps timed:

- ``hand fsdp``: ``fully_shard`` and ``dcp.save`` of the model's state dict; ``hand fsdp,
  async``: ``dcp.async_save`` on a gloo group of its own, the next save waiting for its future;
- ``ptrain fsdp``: ``--strategy fsdp --devices 2``, synchronous and with
  ``--checkpoint-async-save``;
- Lightning refuses ``FSDPStrategy`` on the CPU ("requires a GPU accelerator"): its rows say so.
  ``--no-fsdp`` leaves these arms out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import ptrain

REPO = Path(__file__).resolve().parents[1]
ARMS = [("hand", False), ("hand", True), ("ptrain", False), ("ptrain", True),
        ("lightning", False), ("lightning", True)]
FSDP_ARMS = [("hand fsdp", False), ("hand fsdp", True), ("ptrain fsdp", False),
             ("ptrain fsdp", True), ("lightning fsdp", False)]
PROCESSES = 2  # of an fsdp arm
#: each step's end (see :func:`mark`): the host clock and the process's CPU time, in seconds
StepMarks = list[tuple[float, float]]


def build(quick: bool):
    import torch
    from torch import nn

    torch.manual_seed(0)
    width, depth = (1024, 16) if quick else (4096, 12)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    return model, made_data(quick)


def made_data(quick: bool):
    import torch

    width = 1024 if quick else 4096
    made = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randn(64, width, generator=made),
                                          torch.randn(64, width, generator=made))


#: where the arm's model trains (``--device``); set in the arm's process
DEVICE = "cpu"


def loss_of(model, batch):
    from torch.nn import functional as F

    x, y = (t.to(DEVICE) for t in batch)
    return F.mse_loss(model(x), y)


def mark(marks: StepMarks) -> None:
    """A step's end: the host clock (on a GPU once the device has done the step's work) and
    the CPU time this process has used, all its threads together (a background writer's too)."""
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()
    marks.append((time.perf_counter(), time.process_time()))


def host_copy(tensors: dict[Any, Any]) -> dict[Any, Any]:
    """A copy in host memory of a flat dict's tensors (other values as they are)."""
    import torch

    return {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
            for k, v in tensors.items()}


def hand_save(state: dict[str, Any], path: Path) -> None:
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def make_optimizer(name: str, parameters):
    """``--optimizer``: plain SGD holds no state; Adam holds two moments per parameter, so its
    checkpoint is three times the weights while the step's collectives stay the weights'."""
    import torch

    if name == "adam":
        return torch.optim.Adam(parameters, lr=1e-4)
    return torch.optim.SGD(parameters, lr=1e-3)


def module_of(base: type, model, loader, optimizer: str) -> Any:
    """``model`` as a ``base`` (``ptrain.TrainModule`` or ``lightning.LightningModule``): the
    same step, optimizer and loader under either trainer."""
    class Module(base):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, batch_idx):
            return loss_of(self.net, batch)

        def configure_optimizers(self):
            return make_optimizer(optimizer, self.parameters())

        def train_dataloader(self):
            return loader

    return Module()


def hand_loop(args, model, loader, marks: StepMarks, save: Any) -> None:
    """The training loop of the hand arms, written out: ``save(step, optimizer)`` every
    ``--every`` steps, a mark after each step."""
    optimizer = make_optimizer(args.optimizer, model.parameters())
    step = 0
    while step < args.steps:
        for batch in loader:
            loss_of(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if args.every and step % args.every == 0:
                save(step, optimizer)
            mark(marks)
            if step == args.steps:
                break


def run_hand(args, model, loader, marks: StepMarks, folder: Path, background: bool) -> None:
    writer: threading.Thread | None = None

    def save(step: int, optimizer) -> None:
        nonlocal writer
        if writer is not None:
            writer.join()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        if background:
            copy = {"step": step, "model": host_copy(state["model"]),
                    "optimizer": {**state["optimizer"], "state": {
                        i: host_copy(s) for i, s in state["optimizer"]["state"].items()}}}
            writer = threading.Thread(target=hand_save, args=(copy, folder / "last.ckpt"))
            writer.start()
        else:
            hand_save(state, folder / "last.ckpt")

    hand_loop(args, model, loader, marks, save)
    if writer is not None:
        writer.join()


def run_ptrain(args, model, loader, marks: StepMarks, folder: Path, background: bool) -> None:
    import ptrain

    class Marks:
        name = "benchmark-marks"

        @ptrain.hookimpl(trylast=True)  # after the checkpoint callback's save at this step
        def on_train_batch_end(self):
            mark(marks)

    callbacks: list[Any] = ["no:progress-bar", "no:tensorboard", "no:model-summary",
                            "no:dataloading", Marks()]
    options = {"checkpoint": {"every_n_train_steps": args.every, "every_n_epochs": 0,
                              "async_save": background}}
    if not args.every:
        callbacks.append("no:checkpoint")
        options = {}
    trainer = ptrain.Trainer(accelerator=DEVICE, max_steps=args.steps, max_epochs=-1,
                             callbacks=callbacks, plugin_options=options,
                             default_root_dir=str(folder), num_sanity_val_steps=0)
    trainer.fit(module_of(ptrain.TrainModule, model, loader, args.optimizer))


def run_lightning(args, model, loader, marks: StepMarks, folder: Path,
                  background: bool) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    class Marks(L.Callback):
        def on_train_batch_end(self, *_):
            mark(marks)

    callbacks: list[Any] = [Marks()]
    if args.every:  # Marks first: Lightning saves in ModelCheckpoint's own batch end, after it
        callbacks.append(ModelCheckpoint(dirpath=folder, every_n_train_steps=args.every,
                                         save_last=False, save_top_k=1))
    trainer = L.Trainer(accelerator=DEVICE, devices=1, max_steps=args.steps, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=bool(args.every), callbacks=callbacks,
                        plugins=[AsyncCheckpointIO()] if background else None,
                        default_root_dir=str(folder), num_sanity_val_steps=0)
    trainer.fit(module_of(L.LightningModule, model, loader, args.optimizer))


def hand_fsdp_worker(rank: int, args, folder: Path, port: int, background: bool) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=PROCESSES)
    torch.set_num_threads(args.threads)
    model, data = build(args.quick)
    for layer in model:  # each layer a unit, then the root (the ptrain arm: wrap_classes Linear)
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
    group = dist.new_group(backend="gloo") if background else None
    pending: Any = None
    marks: StepMarks = []

    def save(step: int, optimizer) -> None:
        nonlocal pending
        if pending is not None:
            pending.result()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        if background:
            pending = dcp.async_save(state, checkpoint_id=folder / "last.ckpt",
                                     process_group=group)
        else:
            dcp.save(state, checkpoint_id=folder / "last.ckpt")

    hand_loop(args, model, loader, marks, save)
    if pending is not None:
        pending.result()
    if rank == 0:
        (folder / "marks.json").write_text(json.dumps(marks))
    dist.barrier()  # leave together: gloo aborts a process whose peer tore down first
    dist.destroy_process_group()


def run_hand_fsdp(args, model, loader, marks: StepMarks, folder: Path,
                  background: bool) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(hand_fsdp_worker, args=(args, folder, port, background), nprocs=PROCESSES)
    marks += json.loads((folder / "marks.json").read_text())


class RankZeroMarks:
    """ptrain's step marks on global rank 0, written to ``path`` when fit ends (the ranks are
    other processes than the arm's)."""

    name = "benchmark-marks"

    def __init__(self, path: str):
        self.path, self.marks = path, []

    @ptrain.hookimpl(trylast=True)  # after the checkpoint callback's save at this step
    def on_train_batch_end(self) -> None:
        mark(self.marks)

    @ptrain.hookimpl
    def teardown(self, trainer) -> None:
        if trainer.is_global_zero:
            Path(self.path).write_text(json.dumps(self.marks))


class ShardedBenchModule(ptrain.TrainModule):
    """The model of :func:`build` as a ptrain module that builds it on each rank (nothing of
    800 MB is pickled to the workers)."""

    def __init__(self, quick: bool, threads: int, optimizer: str):
        super().__init__()
        self.quick, self.threads, self.optimizer = quick, threads, optimizer

    def configure_model(self) -> None:
        import torch

        torch.set_num_threads(self.threads)
        self.net = build(self.quick)[0]

    def training_step(self, batch, batch_idx):
        return loss_of(self.net, batch)

    def configure_optimizers(self):
        return make_optimizer(self.optimizer, self.parameters())

    def train_dataloader(self):
        import torch

        return torch.utils.data.DataLoader(made_data(self.quick), batch_size=8)


def run_ptrain_fsdp(args, model, loader, marks: StepMarks, folder: Path,
                    background: bool) -> None:
    callbacks: list[Any] = ["no:progress-bar", "no:tensorboard", "no:model-summary",
                            "no:dataloading", RankZeroMarks(str(folder / "marks.json"))]
    options: dict[str, Any] = {"checkpoint": {"every_n_train_steps": args.every,
                                              "every_n_epochs": 0, "async_save": background},
                               "fsdp": {"empty_init": False, "wrap_classes": ["Linear"]}}
    if not args.every:
        callbacks.append("no:checkpoint")
        del options["checkpoint"]
    trainer = ptrain.Trainer(accelerator="cpu", strategy="fsdp", devices=PROCESSES,
                             max_steps=args.steps, max_epochs=-1, callbacks=callbacks,
                             plugin_options=options, default_root_dir=str(folder),
                             num_sanity_val_steps=0)
    trainer.fit(ShardedBenchModule(args.quick, args.threads, args.optimizer))
    if trainer.is_global_zero:
        marks += json.loads((folder / "marks.json").read_text())


class Refused(Exception):
    """A runner that does not run this arm, with its own words."""


def run_lightning_fsdp(args, model, loader, marks: StepMarks, folder: Path,
                       background: bool) -> None:
    import lightning as L

    try:
        L.Trainer(accelerator="cpu", devices=PROCESSES, strategy="fsdp")
    except ValueError as exc:  # Lightning's FSDP needs a GPU
        raise Refused(str(exc).split(". ")[0]) from None
    raise Refused("no FSDP arm for Lightning here")  # it would run: then it is to be written


RUN = {"hand": run_hand, "ptrain": run_ptrain, "lightning": run_lightning,
       "hand fsdp": run_hand_fsdp, "ptrain fsdp": run_ptrain_fsdp,
       "lightning fsdp": run_lightning_fsdp}


def child(request: dict[str, Any]) -> dict[str, Any] | None:
    """One arm, in a process of its own, in the folder ``request["folder"]``; ``None`` in the
    other ranks of a job that runs this script on every rank (ptrain's script launcher)."""
    import torch

    global DEVICE
    torch.set_num_threads(request["threads"])
    args = argparse.Namespace(**request)
    DEVICE = args.device
    model, data = build(args.quick)
    if args.runner == "hand":
        model.to(DEVICE)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    folder = Path(args.folder)
    marks: StepMarks = []
    start = (time.perf_counter(), time.process_time())
    try:
        RUN[args.runner](args, model, loader, marks, folder, args.background)
    except Refused as exc:
        return {"refused": str(exc)}
    end = time.perf_counter()
    if os.environ.get("RANK", "0") != "0":
        return None
    # the largest checkpoint left: a file, or a sharded folder's files (a runner may leave
    # more than one: Lightning's AsyncCheckpointIO sometimes keeps the file it replaced)
    size = max((sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir()
                else p.stat().st_size for p in folder.rglob("*.ckpt")), default=0)
    walls, cpus = zip(*marks)
    steps = [b - a for a, b in zip([start[0], *walls], walls)]
    # the CPU time of each step after the first (whose start another process may have seen)
    cpu_steps = [b - a for a, b in zip(cpus, cpus[1:])]
    result = {"steps": steps, "cpu_steps": cpu_steps, "seconds": end - start[0],
              "checkpoint_bytes": size,
              "parameters": sum(p.numel() for p in model.parameters())}
    if DEVICE == "cuda":  # the pinned memory the host copies took (rounded up by torch)
        result["pinned_bytes_peak"] = torch.cuda.host_memory_stats().get(
            "allocated_bytes.peak", 0)
    return result


def measure(args, runner: str, background: bool, every: int) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.workdir)
    request = {"runner": runner, "background": background, "every": every, "steps": args.steps,
               "quick": args.quick, "folder": folder, "threads": args.threads,
               "device": args.device, "optimizer": args.optimizer}
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(request)],
                              capture_output=True, text=True, cwd=REPO, timeout=1800)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
    return json.loads(lines[-1][len("RESULT "):])


def figures(result: dict[str, Any], baseline: dict[str, Any], every: int) -> dict[str, float]:
    """Step ``i`` (from 1) saves when ``i % every == 0``; a runner that saves after its step's
    mark (Lightning's callback order) shows the cost in step ``i + 1``: both count."""
    steps = result["steps"]
    plain = [t for i, t in enumerate(steps, start=1)
             if i > 1 and i % every != 0 and (i - 1) % every != 0]
    pairs = [steps[i - 1] + steps[i] for i in range(every, len(steps), every)]
    typical = statistics.median(plain)
    # CPU per save: the CPU time of each whole period from a saving step to the step before
    # the next save (the background write's, wherever it fell), less as many of the baseline's
    # median steps; a step's CPU time is cpu_steps[step - 2]
    cpu, base_cpu = result["cpu_steps"], statistics.median(baseline["cpu_steps"])
    periods = [sum(cpu[i - 2:i - 2 + every]) - every * base_cpu
               for i in range(every, len(steps) - every + 2, every)]
    return {"stall": statistics.mean(pairs) - 2 * typical,
            "extra": (sum(steps[1:]) - sum(baseline["steps"][1:])) / len(pairs),
            "cpu": statistics.mean(periods), "step": typical, "saves": len(pairs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 17 M-parameter model")
    parser.add_argument("--steps", type=int, default=13, help="steps per arm (default 13)")
    parser.add_argument("--every", type=int, default=4, help="a checkpoint every N steps")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's intra-op threads per arm (default 1: the other core is "
                             "the background writer's)")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                        help="sgd (default): a checkpoint is the weights; adam: the weights and "
                             "two moments, three times the bytes for the same step (the fsdp "
                             "arms' collectives move the weights only)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the arms write their checkpoints (made if missing)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--no-fsdp", action="store_true",
                      help="leave out the arms of 2 fsdp processes")
    only.add_argument("--only-fsdp", action="store_true",
                      help="only the arms of 2 fsdp processes (on a host with cores to spare "
                           "for the writer, e.g. a GPU machine's)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the arms of one process train (the fsdp arms: the CPU)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(json.loads(args.child))
        if result is not None:
            print("RESULT " + json.dumps(result), flush=True)
        return 0
    if args.device == "cuda" and args.only_fsdp:
        parser.error("--only-fsdp runs 2 CPU processes: leave out --device cuda")
    if args.device == "cuda" and not args.no_fsdp:
        parser.error("--device cuda trains the arms of one process on a GPU; the fsdp arms "
                     "run 2 CPU processes: add --no-fsdp")
    if args.every < 3 or args.steps < 2 * args.every:
        parser.error("--every must be at least 3 (steps away from a save are the reference) "
                     "and --steps at least twice --every")
    args.workdir.mkdir(parents=True, exist_ok=True)
    import importlib.util

    lightning = importlib.util.find_spec("lightning") is not None
    arms = [(r, b) for r, b in ([] if args.only_fsdp else ARMS) +
            ([] if args.no_fsdp else FSDP_ARMS) if lightning or not r.startswith("lightning")]
    baselines = {r: measure(args, r, False, 0) for r in dict(arms) if r != "lightning fsdp"}
    rows = []
    for runner, background in arms:
        result = measure(args, runner, background, args.every)
        base = baselines.get(runner, {})
        row = {"runner": runner, "async": background, **result}
        if "steps" in result and "steps" in base:
            row.update(figures(result, base, args.every))
        rows.append(row)
        print(f"  {runner:14} {'async' if background else 'sync ':5} "
              f"{row.get('stall', float('nan')):7.3f} s stall  "
              f"{row.get('extra', float('nan')):7.3f} s extra per save "
              f"{row.get('cpu', float('nan')):7.3f} s CPU per save "
              f"{row.get('error', row.get('refused', ''))}", flush=True)
    first = next((r for r in rows if "parameters" in r), {})
    print(f"\ncheckpointing.py: {first.get('parameters', 0) / 1e6:.0f} M parameters, "
          f"checkpoints of {first.get('checkpoint_bytes', 0) / 1e6:.0f} MB, a save every "
          f"{args.every} steps over {args.steps}, {args.optimizer}, {args.threads} intra-op "
          f"thread(s), "
          f"on {args.device}, under {args.workdir}\n")
    print("| runner | writes | step (median, no save) | stall at the save | extra time per save "
          "| CPU per save | vs synchronous |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    sync = {r["runner"]: r for r in rows if not r["async"]}
    for r in rows:
        if "refused" in r:
            print(f"| {r['runner']} | | refused: {r['refused']} | | | | |")
            continue
        if "stall" not in r:
            print(f"| {r['runner']} | {'background' if r['async'] else 'synchronous'} | "
                  f"failed: {r.get('error', '')[:120]} | | | | |")
            continue
        ratio = (f"{r['stall'] / sync[r['runner']]['stall']:.2f}x stall"
                 if r["async"] and "stall" in sync.get(r["runner"], {}) else "")
        print(f"| {r['runner']} | {'background' if r['async'] else 'synchronous'} | "
              f"{r['step'] * 1e3:.0f} ms | {r['stall']:.3f} s | {r['extra']:.3f} s | "
              f"{r['cpu']:.3f} s | {ratio} |")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                        "baselines": baselines, "rows": rows}, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
