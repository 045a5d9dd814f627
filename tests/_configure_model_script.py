"""A 2-rank training run of a model whose layers are made in ``configure_model`` (or in
``__init__``), for ``tests/plugins/strategies/test_configure_model.py``; run as a script, so the
script launcher starts rank 1 as this same program.

    python tests/_configure_model_script.py --root DIR --out DIR --strategy fsdp
        [--build init|configure] [--empty-init true|false] [--resume] [--launcher auto|spawn]
        [--epochs N] [--width W --depth D] [--weights-out FILE]

Every rank writes ``<out>/rank<R>.json``: the rise of its peak resident memory above its
resident memory at the module's ``setup`` (the process group is up, the layers not yet made) to the start of
training (the ``setup`` hook: the model is built, sharded, initialised and any checkpoint
restored), the model's parameter bytes, the bytes of parameter storage it holds, whether any
parameter is whole on it, and the loss of every step. With ``--weights-out``, rank 0 writes the
final full weights there, gathered by :meth:`ptrain.Trainer.full_state_dict`.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import ptrain  # noqa: E402
from _shard_models import make_data  # noqa: E402

#: 32 blocks of 1448 x 1448: 268 MB of float32 parameters, next to which the per-process noise
#: of resident memory (allocator caches, gloo buffers, lazily imported modules) is small, and
#: each unit (8.4 MB) is small.
WIDTH, DEPTH, FEATURES = 1448, 32, 32


class Block(nn.Module):
    """``x + tanh(Linear(x)) / DEPTH``: residual blocks whose sum stays bounded at any depth."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.linear(x)) / DEPTH


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux's VmHWM). Not getrusage's ru_maxrss: that one
    carries over the peak of the process that started this one (the kernel keeps it across
    exec), so under a large parent it reads the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (not Linux?)")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def rss_parts() -> dict[str, int]:
    """Anonymous and file-backed resident memory, in bytes (for a failure's message)."""
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)
                if k in ("RssAnon", "RssFile", "VmHWM")}


class Net(ptrain.TrainModule):
    """``Linear(FEATURES, WIDTH)``, ``DEPTH`` residual blocks, ``Linear(WIDTH, 1)``, made in
    ``configure_model`` (``build="configure"``) or in ``__init__`` (``build="init"``)."""

    def __init__(self, build: str = "configure", width: int = WIDTH, depth: int = DEPTH):
        super().__init__()
        self.build, self.width, self.depth = build, width, depth
        self.blocks = None
        self.losses: list[torch.Tensor] = []
        self.rss_before_setup = 0
        self.train_set = make_data(32, FEATURES, seed=0)  # 2 steps of 8 per rank
        if build == "init":
            self._make_layers()

    def _make_layers(self):
        self.inp = nn.Linear(FEATURES, self.width)
        self.blocks = nn.ModuleList(Block(self.width) for _ in range(self.depth))
        self.head = nn.Linear(self.width, 1)

    def setup(self, stage):  # the process group is up; the layers are made next
        self.rss_before_setup = rss_bytes()
        self.parts_before_setup = rss_parts()

    def configure_model(self):
        if self.blocks is None:
            self._make_layers()

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8)


class MemoryProbe:
    name = "memory-probe"

    def __init__(self, out: Path):
        self.out = out
        self.record: dict = {}

    @ptrain.hookimpl
    def setup(self, trainer):
        params = list(trainer.module.parameters())
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        self.record = {
            "rss_rise": peak_rss_bytes() - trainer.module.rss_before_setup,
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "local_param_bytes": sum(t.numel() * t.element_size() for t in local),
            "any_whole": any(not hasattr(p, "to_local") for p in params if p.dim() > 1),
            "parts_before": trainer.module.parts_before_setup, "parts_after": rss_parts(),
        }

    @ptrain.hookimpl
    def teardown(self, trainer):
        self.record["losses"] = [float(x) for x in trainer.module.losses]
        self.record["global_step"] = trainer.global_step
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default="fsdp")
    p.add_argument("--build", default="configure", choices=["configure", "init"])
    p.add_argument("--resume", action="store_true")
    p.add_argument("--launcher", default="auto")
    p.add_argument("--empty-init", default="true", choices=["true", "false"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--width", type=int, default=WIDTH)
    p.add_argument("--depth", type=int, default=DEPTH)
    p.add_argument("--weights-out", help="rank 0 writes the final full weights there")
    args = p.parse_args()

    out = Path(args.out)
    ptrain.seed_everything(7)
    module = Net(args.build, args.width, args.depth)
    trainer = ptrain.Trainer(
        strategy=args.strategy, devices=2, accelerator="cpu", max_epochs=args.epochs,
        default_root_dir=args.root, callbacks=["no:progress-bar", "no:tensorboard",
                                               "no:model-summary", MemoryProbe(out)],
        plugin_options={args.strategy: {"launcher": args.launcher, "timeout": 120, **(
            {"empty_init": args.empty_init == "true"} if args.strategy != "ddp" else {})}})
    trainer.fit(module, ckpt_path="last" if args.resume else None)
    if args.weights_out:
        weights = trainer.full_state_dict()  # every rank takes part; rank 0 gets them
        if trainer.is_global_zero:
            torch.save(weights, args.weights_out)


if __name__ == "__main__":
    main()
