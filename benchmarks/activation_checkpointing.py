"""What activation checkpointing saves and costs on ``benchmarks/overhead.py``'s ``TinyTransformer``
(its ``nn.TransformerEncoderLayer`` blocks checkpointed, as ``auto`` picks them), on the CPU.

    .venv/bin/python benchmarks/activation_checkpointing.py
    .venv/bin/python benchmarks/activation_checkpointing.py --layers 4 --batch 256

Per mode (plain, checkpointed), from the same initial weights and batches:

- **held after forward**: bytes of the tensor storages created during one forward pass (loss
  included) that are still alive when it returns: what the autograd graph keeps for backward,
  checkpointing's kept block inputs included. Counted exactly: a ``TorchDispatchMode`` records
  every storage an operator creates and a weak reference tells whether it is still alive.
- **step peak**: the most bytes of such storages alive at once during forward + backward
  (polled after every operator; parameters, optimizer state and the batch are not counted).
- **peak RSS growth**: the process's ``ru_maxrss`` after a 10-step fit minus its RSS before it,
  each mode in a fresh process after a warm-up fit with batch 1 (coarse: the allocator keeps
  freed memory, and the fit's own set-up counts too).
- **ms/step**: ``ptrain.Trainer`` (progress bar, TensorBoard, checkpoints off), median interval
  between consecutive ``on_train_batch_end`` calls after 5 warm-up steps,
  ``torch.set_num_threads(1)``; both modes alternate over ``--repeats`` fresh fits.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ptrain  # noqa: E402
from benchmarks.overhead import TinyTransformer, token_data  # noqa: E402
from ptrain.module_classes import checkpoint_activations  # noqa: E402
from ptrain.testing import LiveStorages  # noqa: E402
from ptrain_activation_checkpointing import ActivationCheckpointing  # noqa: E402


def memory(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(held after forward, step peak) for one forward + backward of ``net``."""
    with LiveStorages() as held:
        loss = torch.nn.functional.cross_entropy(net(x), y)
    after_forward = held.live()
    loss.backward()
    del loss
    net.zero_grad(set_to_none=True)
    with LiveStorages(poll=True) as peak:
        torch.nn.functional.cross_entropy(net(x), y).backward()
    net.zero_grad(set_to_none=True)
    return after_forward, peak.peak


class Classifier(ptrain.TrainModule):
    def __init__(self, layers: int, batch: int, steps: int):
        super().__init__()
        torch.manual_seed(0)
        self.net = TinyTransformer(layers=layers)
        self.batch = batch
        self.data = token_data(batch * steps, torch.Generator().manual_seed(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch)


class BatchTimes:
    name = "batch-times"

    def __init__(self):
        self.times: list[float] = []

    @ptrain.hookimpl
    def on_train_batch_end(self):
        self.times.append(time.perf_counter())


def fit(module: Classifier, checkpointed: bool, root: str) -> list[float]:
    timer = BatchTimes()
    callbacks = ["no:progress-bar", "no:tensorboard", "no:checkpoint", timer]
    if checkpointed:
        callbacks.append(ActivationCheckpointing(classes=["auto"]))
    ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=root,
                   callbacks=callbacks).fit(module)
    return [b - a for a, b in zip(timer.times[5:], timer.times[6:])]


def rss_child(args: argparse.Namespace) -> None:
    """In a fresh process: one fit in the mode asked for; prints the peak RSS growth (bytes)."""
    import tempfile
    checkpointed = args.rss_child == "checkpointed"
    with tempfile.TemporaryDirectory() as root:
        fit(Classifier(args.layers, 1, 10), checkpointed, root)  # imports, lazy set-up
        module = Classifier(args.layers, args.batch, 10)
        with open("/proc/self/statm") as f:
            before = int(f.read().split()[1]) * resource.getpagesize()
        fit(module, checkpointed, root)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(peak - before))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60, help="steps per timed fit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rss-child", choices=("plain", "checkpointed"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.rss_child:
        return rss_child(args)

    print(f"TinyTransformer: d_model 64, 4 heads, {args.layers} layers, sequence 32, "
          f"batch {args.batch}; torch {torch.__version__}, 1 thread")
    torch.manual_seed(0)
    plain = TinyTransformer(layers=args.layers)
    checkpointed = copy.deepcopy(plain)
    blocks = checkpoint_activations(checkpointed, ["auto"])
    g = torch.Generator().manual_seed(1)
    x, y = token_data(args.batch, g).tensors
    mem = {"plain": memory(plain, x, y), "checkpointed": memory(checkpointed, x, y)}

    rss = {}
    for mode in mem:
        out = subprocess.run([sys.executable, __file__, "--layers", str(args.layers), "--batch",
                              str(args.batch), "--rss-child", mode], capture_output=True,
                             text=True, check=True, cwd=REPO)
        rss[mode] = json.loads(out.stdout.strip().splitlines()[-1])

    import tempfile
    times: dict[str, list[float]] = {"plain": [], "checkpointed": []}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.repeats):
            for mode in times:
                module = Classifier(args.layers, args.batch, args.steps)
                times[mode] += fit(module, mode == "checkpointed", root)

    print(f"{len(blocks)} blocks checkpointed ({type(blocks[0]).__name__})")
    print(f"{'mode':<14}{'held after fwd':>16}{'step peak':>12}{'peak RSS +':>12}{'ms/step':>10}")
    for mode in mem:
        print(f"{mode:<14}{mem[mode][0] / 2**20:>12.2f} MiB{mem[mode][1] / 2**20:>8.2f} MiB"
              f"{rss[mode] / 2**20:>8.1f} MiB{statistics.median(times[mode]) * 1e3:>10.2f}")
    ratio = statistics.median(times["checkpointed"]) / statistics.median(times["plain"])
    print(f"held after forward x{mem['checkpointed'][0] / mem['plain'][0]:.3f}, step peak "
          f"x{mem['checkpointed'][1] / mem['plain'][1]:.3f}, time per step x{ratio:.3f}")


if __name__ == "__main__":
    main()
