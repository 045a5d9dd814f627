"""A model too large for one rank: each rank's memory while the model is built and trained, and
the cost of a script's second and third stage calls; ptrain against the same model built whole,
and against Lightning.

    .venv/bin/python benchmarks/sharding.py              # about 8 minutes on 2 cores
    .venv/bin/python benchmarks/sharding.py --quick      # a 32 MiB model, one stage run each
    .venv/bin/python benchmarks/sharding.py --only meshes      # one section (memory, stages,
                                                               # meshes)

**Memory.** The model: ``Linear(32, W)``, ``D`` residual blocks ``x + tanh(Linear(W, W)(x)) / D``
(each block a unit FSDP shards), ``Linear(W, 1)``; W = 1448, D = 32: 67 M parameters, 256 MiB
in float32, so parameters plus gradients take 513 MiB. Each rank may use ``--rank-budget-mb``
(400 MiB) above what it held before the model existed: more than the model's parameters, less
than parameters plus gradients, so a whole replica (``ddp``) cannot train within it. Each
configuration is a 2-rank job (gloo, the script launcher), 2 SGD steps of 8 samples per rank:

- ``ddp, built whole``: the layers made in ``__init__``; every rank a whole replica;
- ``fsdp``/``zero3``/``zero2``, ``built whole``: the same, sharded when wrapped;
- ``fsdp``/``zero3``/``zero2``, ``configure_model``: the layers made in ``configure_model``, on the
  meta device; each rank allocates and initialises only its shards (:mod:`ptrain.meta_init`).

Each rank records its resident memory after the imports, before the model or the trainer
exists (the baseline), the peak by the start of training (``setup``: built, wrapped, sharded,
initialised), and the peak by the end (two steps: gathered units, gradients). The table gives
the largest rank's rises above its baseline, in MiB and as a multiple of the parameter bytes, and
whether they stay within the budget, with the first steps' loss (the same in every row: the
same initial weights, built whole or from the meta device). Every child runs with glibc's
mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_=65536``; see ``FIXED_MALLOC``), so that resident
memory shows what is held rather than what the allocator kept after freeing.

**Stage calls.** A script that calls ``fit`` (4 steps of a 9-parameter model), then
``validate`` twice, on one trainer with ``ddp`` on 2 ranks: the wall time of each call on rank
0, for ptrain's script launcher (the script started again as rank 1, up for the whole script),
ptrain's spawn launcher (new workers per call, as in a notebook), and Lightning 2.6.6's ``ddp``
(its own script launcher), every one in a fresh process; the fastest of ``--repeats`` runs.

**Meshes.** One decoder on 4 processes under ``ddp``, ``fsdp``, hybrid ``fsdp`` 2 x 2 and
``model-parallel`` 2 x 2, against a hand-written FSDP2 x tensor-parallel loop and Lightning's
``ModelParallelStrategy(2, 2)``: see ``benchmarks/meshes.py``.
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
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import meshes  # noqa: E402
import ptrain  # noqa: E402
from overhead import source_revision  # noqa: E402
from resident_memory import peak_rss_bytes, rss_bytes  # noqa: E402

#: glibc's malloc raises its mmap threshold each time a large block is freed, after which freed
#: tensors stay in the process's heap: resident memory then grows over the steps (under FSDP
#: here by ~100 MiB over 8 steps of a 32 MiB model) without anything being held. A fixed
#: threshold makes resident memory follow what is held, in every configuration alike.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536"}
MEMORY_CONFIGS = [("ddp", "init"), ("fsdp", "init"), ("fsdp", "configure"), ("zero3", "init"),
                  ("zero3", "configure"), ("zero2", "init"), ("zero2", "configure")]
STAGE_CONFIGS = ["ptrain script", "ptrain spawn", "lightning ddp"]


# -- memory ----------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.linear, self.depth = nn.Linear(width, width), depth

    def forward(self, x):
        return x + torch.tanh(self.linear(x)) / self.depth


class BigNet(ptrain.TrainModule):
    def __init__(self, width: int, depth: int, build: str):
        super().__init__()
        self.width, self.depth = width, depth
        self.blocks = None
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 32, generator=g)
        self.data = TensorDataset(x, torch.sin(x.sum(1, keepdim=True)))
        self.losses: list[torch.Tensor] = []
        if build == "init":
            self.configure_model()

    def configure_model(self):
        if self.blocks is not None:
            return
        self.inp = nn.Linear(32, self.width)
        self.blocks = nn.ModuleList(Block(self.width, self.depth) for _ in range(self.depth))
        self.head = nn.Linear(self.width, 1)

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
        return DataLoader(self.data, batch_size=8)


class MemoryRecorder:
    """Each rank's baseline, peak by ``setup`` and peak by ``teardown``, to ``rank<R>.json``."""

    name = "memory-recorder"

    def __init__(self, out_dir: str, baseline: int):
        self.out_dir, self.baseline = out_dir, baseline
        self.record: dict = {}

    @ptrain.hookimpl
    def setup(self, trainer):
        self.record["setup_peak"] = peak_rss_bytes()
        self.record["param_bytes"] = sum(p.numel() * p.element_size()
                                         for p in trainer.module.parameters())

    @ptrain.hookimpl
    def teardown(self, trainer):
        self.record.update(baseline=self.baseline, train_peak=peak_rss_bytes(),
                           losses=[float(x) for x in trainer.module.losses])
        path = Path(self.out_dir) / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.record))


def run_memory(strategy: str, build: str, width: int, depth: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    baseline = rss_bytes()
    ptrain.seed_everything(0)
    module = BigNet(width, depth, build)
    trainer = ptrain.Trainer(
        accelerator="cpu", strategy=strategy, devices=2, max_epochs=1,
        default_root_dir=os.path.join(out_dir, "runs"),
        callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint", "no:model-summary",
                   MemoryRecorder(out_dir, baseline)])
    trainer.fit(module)


# -- stage calls -------------------------------------------------------------------------------


def tiny_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


class TinySteps:
    """The steps of the stage-call script's 9-parameter model, for ptrain's and Lightning's
    module classes alike."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(tiny_data(), batch_size=8)

    def val_dataloader(self):
        return DataLoader(tiny_data(), batch_size=8)


class PtrainTiny(TinySteps, ptrain.TrainModule):  # module level: the spawn launcher pickles it
    pass


def run_stages(config: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    if config.startswith("ptrain"):
        module = PtrainTiny()
        trainer = ptrain.Trainer(
            accelerator="cpu", strategy="ddp", devices=2, max_steps=4,
            default_root_dir=os.path.join(out_dir, "runs"),
            callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint", "no:model-summary"],
            plugin_options={"ddp": {"launcher": config.split()[1]}})
    else:
        import lightning.pytorch as L

        class LightningTiny(TinySteps, L.LightningModule):
            pass

        module = LightningTiny()
        trainer = L.Trainer(accelerator="cpu", strategy=config.split()[1], devices=2,
                            max_steps=4, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, default_root_dir=out_dir)
    quiet = {} if config.startswith("ptrain") else {"verbose": False}
    times = []
    for call in ("fit", "validate", "validate"):
        start = time.perf_counter()
        getattr(trainer, call)(module, **(quiet if call == "validate" else {}))
        times.append(time.perf_counter() - start)
    if int(os.environ.get("RANK", "0")) == 0 and trainer.global_rank == 0:
        Path(out_dir, "stages.json").write_text(json.dumps({"times": times}))


# -- the parent ------------------------------------------------------------------------------


def child(argv: list[str], out_dir: str, timeout: float) -> tuple[int, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--out", out_dir]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "PTRAIN_GLOBAL_SEED", "PTRAIN_LAUNCHER_PID", "PTRAIN_ERROR_DIR")}
    env.update(FIXED_MALLOC)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(r) for r in rows)])


def memory_rows(args) -> list[list[str]]:
    rows = []
    budget = args.rank_budget_mb * 2**20
    for strategy, build in MEMORY_CONFIGS:
        with tempfile.TemporaryDirectory(prefix="ptrain-bench-") as out:
            code, output = child(["--child", "memory", strategy, build, "--width",
                                  str(args.width), "--depth", str(args.depth)], out, 600)
            ranks = [json.loads(p.read_text()) for p in Path(out).glob("rank*.json")]
        label = f"{strategy}, {'built whole' if build == 'init' else 'configure_model'}"
        if code != 0 or len(ranks) != 2:
            rows.append([label, f"failed ({code})", *[""] * 6])
            print(output[-3000:], file=sys.stderr)
            continue
        params = ranks[0]["param_bytes"]  # of the whole model (a DTensor's numel is global)
        setup = max(r["setup_peak"] - r["baseline"] for r in ranks)
        train = max(r["train_peak"] - r["baseline"] for r in ranks)
        rows.append([label, f"{setup / 2**20:.0f}", f"{setup / params:.2f}x",
                     f"{train / 2**20:.0f}", f"{train / params:.2f}x",
                     "yes" if train <= budget else "no",
                     " ".join(f"{x:.4f}" for x in ranks[0]["losses"])])
        print(f"  {label}: done", file=sys.stderr, flush=True)
    return rows


def stage_rows(args) -> list[list[str]]:
    rows = []
    for config in STAGE_CONFIGS:
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="ptrain-bench-") as out:
                start = time.perf_counter()
                code, output = child(["--child", "stages", config], out, 600)
                whole = time.perf_counter() - start
                result = Path(out, "stages.json")
                if code != 0 or not result.exists():
                    print(output[-3000:], file=sys.stderr)
                    break
                runs.append((*json.loads(result.read_text())["times"], whole))
        if not runs:
            rows.append([config, "failed", "", "", ""])
            continue
        best = min(runs, key=lambda r: r[3])  # the fastest whole script
        rows.append([config, *(f"{t:.2f}" for t in best)])
        print(f"  {config}: done", file=sys.stderr, flush=True)
    return rows


def mesh_rows(args) -> list[list[str]]:
    rows = []
    for label in meshes.CONFIGS:
        with tempfile.TemporaryDirectory(prefix="ptrain-bench-") as out:
            code, output = child(["--child", "meshes", label], out, 900)
            ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
        if code != 0 or len(ranks) != meshes.PROCESSES:
            rows.append([label, f"failed ({code})", *[""] * (len(meshes.HEADERS) - 2)])
            print(output[-3000:], file=sys.stderr)
            continue
        rows.append(meshes.row(label, ranks))
        print(f"  {label}: done", file=sys.stderr, flush=True)
    return rows


SECTIONS = ("memory", "stages", "meshes")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, default=1448)
    p.add_argument("--depth", type=int, default=32)
    p.add_argument("--rank-budget-mb", type=float, default=400.0,
                   help="MiB each rank may use above its baseline")
    p.add_argument("--repeats", type=int, default=2, help="runs of each stage-call script")
    p.add_argument("--quick", action="store_true", help="a 32 MiB model, one run of each script")
    p.add_argument("--only", choices=SECTIONS, action="append",
                   help="run this section (again for several); default: all")
    args = p.parse_args()
    if args.child:
        if args.child[0] == "memory":
            run_memory(args.child[1], args.child[2], args.width, args.depth, args.out)
        elif args.child[0] == "meshes":
            meshes.run_child(" ".join(args.child[1:]), args.out)
        else:
            run_stages(" ".join(args.child[1:]), args.out)
        return
    sections = args.only or SECTIONS
    if args.quick:
        args.width, args.depth, args.repeats = 512, 32, 1
        args.rank_budget_mb = 50.0
    params_mb = (32 * args.width + args.depth * (args.width + 1) * args.width + args.width + 1
                 ) * 4 / 2**20
    print(f"ptrain {source_revision()}, torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    if "memory" in sections:
        print(f"Memory per rank: a {params_mb:.0f} MiB model (parameters + gradients "
              f"{2 * params_mb:.0f} MiB), 2 ranks, budget {args.rank_budget_mb:.0f} MiB per "
              f"rank\n", flush=True)
        print(table(["configuration", "setup peak MiB", "x params", "training peak MiB",
                     "x params", "within budget", "first losses (rank 0)"], memory_rows(args)))
        print("\n(x params: the rise as a multiple of the model's parameter bytes)\n")
    if "stages" in sections:
        print("Stage calls of one script (ddp, 2 ranks), seconds on rank 0\n", flush=True)
        print(table(["launcher", "fit", "validate #1", "validate #2", "whole script"],
                    stage_rows(args)))
        print()
    if "meshes" in sections:
        print(f"Meshes: examples/decoder.py's decoder ({meshes.DIMS}), AdamW, "
              f"{meshes.STEPS} steps of {meshes.GLOBAL_BATCH} sequences, 4 processes; "
              f"ms/step after {meshes.WARMUP} steps, losses averaged over the replicas\n",
              flush=True)
        print(table(meshes.HEADERS, mesh_rows(args)))


if __name__ == "__main__":
    main()
