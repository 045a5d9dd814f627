"""Each precision plugin on the small transformer, side by side: time per step, peak memory and
final loss against 32-true.

    .venv/bin/python benchmarks/precision.py                 # CPU, every installed precision
    .venv/bin/python benchmarks/precision.py --steps 60      # shorter
    .venv/bin/python benchmarks/precision.py --accelerator cuda   # where a CUDA plugin exists

What runs: the transformer of ``benchmarks/overhead.py`` (embedding, 2-layer encoder, d_model 64,
4 heads, sequence 32, 10 classes; batch 16; AdamW lr 1e-3) on a learnable counting task (see
:func:`counting_task`), trained by ``ptrain.Trainer`` for ``--steps`` optimizer steps from the same
initial weights on the same batches, once per precision.
Each precision runs in its own child process so that its peak memory is its own:

- time per step: wall time between the end of step ``--warmup`` and the end of the last step,
  divided by the steps in between (``perf_counter`` in ``on_train_batch_end``; the start-up and
  the first steps are left out);
- peak memory: on CUDA, ``torch.cuda.max_memory_allocated``; on the CPU, the child's peak
  resident set size (``ru_maxrss``: it includes the ~300 MB of the Python process and the torch
  libraries, the same for every precision, so compare the differences);
- final loss: the mean training loss of the last 20 steps, and its difference to 32-true's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
LAST_STEPS = 20


def child(precision: str, steps: int, warmup: int, accelerator: str) -> dict:
    """One training run; returns its figures (runs inside the child process)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    import ptrain

    sys.path.insert(0, str(HERE))
    from overhead import TinyTransformer

    torch.set_num_threads(1)
    data = counting_task(16 * steps, torch.Generator().manual_seed(0))

    class Transformer(ptrain.TrainModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = TinyTransformer()

        def training_step(self, batch, batch_idx):
            tokens, labels = batch
            return nn.functional.cross_entropy(self.net(tokens), labels)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return DataLoader(data, batch_size=16)

    class Recorder:
        name = "recorder"

        def __init__(self):
            self.times, self.losses = [], []

        @ptrain.hookimpl
        def on_train_batch_end(self, loss):
            self.times.append(time.perf_counter())
            self.losses.append(loss.detach())

    recorder = Recorder()
    trainer = ptrain.Trainer(
        accelerator=accelerator, precision=precision, max_steps=steps,
        default_root_dir=tempfile.mkdtemp(),
        callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint", recorder])
    try:
        trainer.fit(Transformer())
    except ptrain.NonFiniteLossError as exc:
        return {"precision": precision, "error": str(exc).split(";")[0]}
    times = recorder.times
    losses = torch.stack([l.float() for l in recorder.losses[-LAST_STEPS:]])
    result = {"precision": precision,
              "us_per_step": 1e6 * (times[-1] - times[warmup - 1]) / (len(times) - warmup),
              "final_loss": float(losses.mean())}
    if trainer.device.type == "cuda":
        result["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        result["memory_kind"] = "CUDA allocated"
    return result


def counting_task(n: int, g):
    """Sequences of 32 random tokens; the label is how many "marker" tokens (ids below 16) a
    sequence holds, capped at 9: learnable, so the final losses say something."""
    import torch
    from torch.utils.data import TensorDataset

    tokens = torch.randint(0, 512, (n, 32), generator=g)
    return TensorDataset(tokens, (tokens < 16).sum(dim=1).clamp(max=9))


def run_child(precision: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", precision, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--accelerator", args.accelerator]
    with tempfile.TemporaryFile(mode="w+") as err:  # a file: no pipe to fill up
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # reaps it, with its own resource usage
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        if proc.returncode != 0:
            return {"precision": precision,
                    "error": (err.read().strip().splitlines() or ["failed"])[-1]}
    result = json.loads(out.strip().splitlines()[-1])
    if "peak_mb" not in result:
        result["peak_mb"] = usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux
        result["memory_kind"] = "process peak RSS"
    return result


def installed_precisions() -> list[str]:
    from ptrain.catalog import Catalog

    names = set(Catalog.discover().names("precision"))
    return [p for p in PRECISIONS if p in names]


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["precision"] == "32-true" and "error" not in r), None)
    rows = [("precision", "µs/step", "vs 32-true", "peak MB", "vs 32-true", "final loss",
             "vs 32-true")]
    for r in results:
        if "error" in r:
            rows.append((r["precision"], "-", "-", "-", "-", "-", r["error"][:60]))
            continue
        speed = f"{base['us_per_step'] / r['us_per_step']:.2f}x" if base else ""
        memory = f"{r['peak_mb'] - base['peak_mb']:+.0f} MB" if base else ""
        loss = (f"{100 * (r['final_loss'] - base['final_loss']) / base['final_loss']:+.2f}%"
                if base else "")
        rows.append((r["precision"], f"{r['us_per_step']:.0f}", speed, f"{r['peak_mb']:.0f}",
                     memory, f"{r['final_loss']:.4f}", loss))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.warmup, args.accelerator)))
        return
    import torch

    print(f"# precision benchmark: small transformer, batch 16, {args.steps} steps "
          f"({args.warmup} warm-up), accelerator {args.accelerator}, torch {torch.__version__}, "
          f"1 intra-op thread, {os.cpu_count()} CPUs\n")
    results = [run_child(p, args) for p in installed_precisions()]
    print(table(results))
    kinds = {r.get("memory_kind") for r in results} - {None}
    print(f"\npeak memory: {', '.join(sorted(kinds))}; final loss: mean of the last "
          f"{LAST_STEPS} steps")


if __name__ == "__main__":
    main()
