"""``ptrain tune`` on the bundled digits example and on the small transformer, as a user runs it:
the command's own table for each, for docs/tune.md.

    .venv/bin/python benchmarks/tune.py                   # both models, 10 minutes each at most
    .venv/bin/python benchmarks/tune.py --budget 3m       # shorter
    .venv/bin/python benchmarks/tune.py --accelerator cuda    # on a GPU (issue 14's script)

What runs: ``ptrain tune --config <digits.toml>`` (the example's MLP on scikit-learn's digits,
batch 32) and ``ptrain tune --model benchmarks.tune:CountingTransformer`` (the transformer of
``benchmarks/overhead.py`` on the counting task of ``benchmarks/precision.py``: embedding,
2-layer encoder, d_model 64, 4 heads, sequence 32; batch 16; AdamW), each with every candidate
the installed plugins offer, with the command's defaults (5 warm-up steps; measured steps enough
for about 1 s of the baseline; at most 3 interleaved repeats) within ``--budget``. The tuned
config files are written to a temporary folder and removed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import ptrain

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


class CountingTransformer(ptrain.TrainModule):
    """The small transformer on the counting task (a learnable task: the loss says something)."""

    def __init__(self, n: int = 4096, batch_size: int = 16, lr: float = 1e-3):
        super().__init__()
        import torch

        sys.path.insert(0, str(HERE))
        from overhead import TinyTransformer
        from precision import counting_task

        self.net = TinyTransformer()
        self.data = counting_task(n, torch.Generator().manual_seed(0))
        self.batch_size, self.lr = batch_size, lr

    def training_step(self, batch, batch_idx):
        from torch import nn

        tokens, labels = batch
        return nn.functional.cross_entropy(self.net(tokens), labels)

    def configure_optimizers(self):
        import torch

        return torch.optim.AdamW(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        from torch.utils.data import DataLoader

        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


MODELS = {"digits": ("digits (the bundled example)", None),
          "transformer": ("small transformer", ["--model", "benchmarks.tune:CountingTransformer"])}


def run(label: str, args: list[str], budget: str, accelerator: str) -> int:
    with tempfile.TemporaryDirectory(prefix="ptrain-tune-bench-") as out:
        command = [sys.executable, "-m", "ptrain", "tune", *args, "--accelerator", accelerator,
                   "--tune-budget", budget,
                   "--tune-output", str(Path(out) / "tuned.toml")]
        print(f"## {label}\n\n`ptrain tune {' '.join(args)} --accelerator {accelerator} "
              f"--tune-budget {budget}`\n", flush=True)
        return subprocess.run(command, cwd=REPO).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="10m", help="--tune-budget of each tune")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--models", default="digits,transformer",
                        help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--tune-args", default="",
                        help="more arguments for each ptrain tune (e.g. '--tune-only precision')")
    args = parser.parse_args(argv)
    chosen = [m for m in args.models.split(",") if m]
    unknown = [m for m in chosen if m not in MODELS]
    if unknown:
        parser.error(f"--models: {', '.join(unknown)} not among {', '.join(MODELS)}")
    from ptrain.examples import config_path

    failed = 0
    for name in chosen:
        label, model_args = MODELS[name]
        model_args = model_args or ["--config", str(config_path("digits"))]
        failed |= run(label, [*model_args, *args.tune_args.split()], args.budget,
                      args.accelerator)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
