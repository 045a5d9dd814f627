"""The mesh section of ``benchmarks/sharding.py``: one decoder on 4 processes, data parallel,
sharded, hybrid and tensor parallel, against a hand-written FSDP2 x tensor-parallel loop and
Lightning's ``ModelParallelStrategy``.

The model is ``examples/decoder.py``'s decoder at ``DIMS`` (6.3 M parameters, 24 MiB in
float32), AdamW, ``STEPS`` steps from the same initial weights (built whole on every process,
seeded) on the same global batches of ``GLOBAL_BATCH`` sequences. Each configuration is a child
process that starts 4 processes (gloo, 1 intra-op thread each):

- ``ptrain ddp`` / ``ptrain fsdp``: 4 replicas of 8 sequences;
- ``ptrain fsdp, replicate 2 x shard 2``: ``--fsdp-replicate 2`` (hybrid sharding);
- ``ptrain model-parallel, shard 2 x tensor 2``: 2 replicas of 16 sequences, each split over a
  tensor-parallel pair (the decoder's plan);
- ``hand-written FSDP2 x TP, 2 x 2``: ``torch.multiprocessing`` workers, ``init_device_mesh``,
  ``parallelize_module`` with the same plan, ``fully_shard`` over the data-parallel dimension,
  a ``DistributedSampler`` by data-parallel rank and ``backward(); step(); zero_grad()``;
- ``lightning ModelParallelStrategy(2, 2)``: Lightning 2.6.6, a LightningModule whose
  ``configure_model`` applies the same plan and ``fully_shard`` (as Lightning's example does).

Per rank: the parameter and optimizer-state bytes it holds at the second optimizer step (of a
DTensor only its local part; :func:`ptrain.distributed.held_bytes`), its peak resident memory
above what it held after the imports (``peak RSS``: the process's high-water mark less its
resident memory then), and the end time of each step. ms/step is the slowest
rank's span from the end of step ``WARMUP`` to the end of the last step.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):  # the benchmarks' helpers, and examples/
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import ptrain  # noqa: E402
from examples.decoder import Decoder, arithmetic_sequences  # noqa: E402
from ptrain.distributed import held_bytes  # noqa: E402
from resident_memory import peak_rss_bytes, rss_bytes  # noqa: E402

DIMS = dict(vocab=4096, dim=256, heads=8, depth=4, hidden=1024, length=64)
GLOBAL_BATCH, STEPS, WARMUP, PROCESSES = 32, 30, 5, 4
LR = 1e-3

#: label -> (runner, ptrain strategy, its options, data-parallel size)
CONFIGS = {
    "ptrain ddp": ("ptrain", "ddp", {}, 4),
    "ptrain fsdp": ("ptrain", "fsdp", {}, 4),
    "ptrain fsdp, replicate 2 x shard 2": ("ptrain", "fsdp", {"replicate": 2}, 4),
    "ptrain model-parallel, shard 2 x tensor 2": ("ptrain", "model-parallel", {"tensor": 2}, 2),
    "hand-written FSDP2 x TP, 2 x 2": ("torch", None, {}, 2),
    "lightning ModelParallelStrategy(2, 2)": ("lightning", None, {}, 2),
}


def import_as_lightning_does() -> None:
    """Every process imports what the Lightning configuration's do before its baseline: memory
    an import frees stays in the heap, and later allocations reuse it without raising the
    resident size (importing lightning first took the hand-written run's peak from 254 to 185
    MiB), so processes that imported different things would have incomparable peaks."""
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        pass


def samples() -> int:
    return GLOBAL_BATCH * STEPS


class Record:
    """What one rank measures; :meth:`write` puts it in ``<out>/rank<R>.json``."""

    def __init__(self, out: str):
        self.out = out
        self.baseline = rss_bytes()  # what it holds now: not an import's passing peak
        self.ends: list[float] = []
        self.losses: list[torch.Tensor] = []
        self.held: dict | None = None
        self.optimizer_steps = 0

    def before_optimizer_step(self, model, optimizers) -> None:
        self.optimizer_steps += 1
        if self.optimizer_steps == 2:  # Adam's state exists from the first step
            self.held = held_bytes(model, optimizers)

    def step_end(self, loss: torch.Tensor) -> None:
        self.ends.append(time.perf_counter())
        self.losses.append(loss.detach())

    def write(self, rank: int, data_parallel_rank: int) -> None:
        losses = [float(x.full_tensor() if hasattr(x, "full_tensor") else x) for x in self.losses]
        Path(self.out, f"rank{rank}.json").write_text(json.dumps({
            "held": self.held, "peak": peak_rss_bytes() - self.baseline, "ends": self.ends,
            "losses": losses, "data_parallel_rank": data_parallel_rank}))


# -- ptrain -------------------------------------------------------------------------------------


class PtrainRecorder:
    name = "mesh-recorder"

    def __init__(self, record: Record):
        self.record = record

    @ptrain.hookimpl
    def on_before_optimizer_step(self, trainer, optimizer):
        self.record.before_optimizer_step(trainer.module, trainer.optimizers)

    @ptrain.hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss):
        self.record.step_end(loss)

    @ptrain.hookimpl
    def teardown(self, trainer):
        strategy = trainer.plugins.get(trainer.options["strategy"])
        self.record.write(trainer.global_rank, strategy.data_parallel(trainer)[0])


def run_ptrain(label: str, out: str) -> None:
    _, strategy, options, data_parallel = CONFIGS[label]
    record = Record(out)
    ptrain.seed_everything(0)
    module = Decoder(**DIMS, samples=samples(), batch_size=GLOBAL_BATCH // data_parallel,
                     lr=LR, build="init")
    trainer = ptrain.Trainer(
        accelerator="cpu", strategy=strategy, devices=PROCESSES, max_epochs=1,
        default_root_dir=os.path.join(out, "runs"), plugin_options={strategy: options},
        callbacks=["no:progress-bar", "no:tensorboard", "no:checkpoint", "no:model-summary",
                   PtrainRecorder(record)])
    trainer.fit(module)


# -- the same plan, by hand and under Lightning -------------------------------------------------


def parallelize(model: Decoder, mesh) -> None:
    """The decoder's own plan on ``mesh["tp"]``, then FSDP2 over ``mesh["dp"]``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh["tp"], model.plan())
    for block in model.layers:
        parallelize_module(block, mesh["tp"], model.block_plan())
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])


def hand_written_worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    import_as_lightning_does()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=PROCESSES)
    from torch.distributed.device_mesh import init_device_mesh

    record = Record(out)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Decoder(**DIMS, build="init")
    parallelize(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    dp_rank = mesh["dp"].get_local_rank()
    data = arithmetic_sequences(samples(), DIMS["vocab"], DIMS["length"])
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // 2,
                        sampler=DistributedSampler(data, num_replicas=2, rank=dp_rank,
                                                   shuffle=False))
    for tokens, targets in loader:
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        record.before_optimizer_step(model, [optimizer])
        optimizer.step()
        optimizer.zero_grad()
        record.step_end(loss)
    record.write(rank, dp_rank)
    dist.barrier()  # leave together: gloo aborts a process whose peer tore down first
    dist.destroy_process_group()


def run_hand_written(out: str) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(hand_written_worker, args=(port, out), nprocs=PROCESSES,
                       start_method="spawn")


def run_lightning(out: str) -> None:
    import lightning.pytorch as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    torch.set_num_threads(1)
    record = Record(out)

    class LightningDecoder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = Decoder(**DIMS, build="init")

        def configure_model(self):
            mesh = self.device_mesh
            # Lightning names the dimensions data_parallel and tensor_parallel
            named = {"dp": mesh["data_parallel"], "tp": mesh["tensor_parallel"]}
            parallelize(self.model, named)

        def training_step(self, batch, batch_idx):
            tokens, targets = batch
            logits = self.model(tokens)
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

        def on_before_optimizer_step(self, optimizer):
            record.before_optimizer_step(self.model, [optimizer])

        def on_train_batch_end(self, outputs, batch, batch_idx):
            record.step_end(outputs["loss"])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.model.parameters(), lr=LR)

        def train_dataloader(self):
            # by data-parallel rank, in order (the sampler Lightning would insert shuffles)
            data = arithmetic_sequences(samples(), DIMS["vocab"], DIMS["length"])
            rank = self.device_mesh["data_parallel"].get_local_rank()
            return DataLoader(data, batch_size=GLOBAL_BATCH // 2, sampler=DistributedSampler(
                data, num_replicas=2, rank=rank, shuffle=False))

    L.seed_everything(0, verbose=False)
    module = LightningDecoder()
    trainer = L.Trainer(accelerator="cpu", devices=PROCESSES, max_epochs=1, logger=False,
                        strategy=ModelParallelStrategy(data_parallel_size=2,
                                                       tensor_parallel_size=2),
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False,
                        default_root_dir=out)
    trainer.fit(module)
    record.write(trainer.global_rank,
                 module.device_mesh["data_parallel"].get_local_rank())


def run_child(label: str, out: str) -> None:
    """Runs configuration ``label``; its processes write ``<out>/rank<R>.json``."""
    runner = CONFIGS[label][0]
    torch.set_num_threads(1)
    import_as_lightning_does()
    if runner == "ptrain":
        run_ptrain(label, out)
    elif runner == "torch":
        run_hand_written(out)
    else:
        run_lightning(out)


# -- the table ----------------------------------------------------------------------------------


def row(label: str, ranks: list[dict]) -> list[str]:
    """The table's cells for one configuration's ranks."""
    params = max(r["held"]["parameters"] for r in ranks)
    state = max(r["held"]["optimizer_state"] for r in ranks)
    peak = max(r["peak"] for r in ranks)
    span = max(r["ends"][-1] - r["ends"][WARMUP - 1] for r in ranks)
    steps = len(ranks[0]["ends"]) - WARMUP
    replicas = {r["data_parallel_rank"]: r["losses"] for r in ranks}
    losses = [sum(step) / len(replicas) for step in zip(*replicas.values())]
    return [label, f"{params / 2**20:.2f}", f"{state / 2**20:.2f}", f"{peak / 2**20:.0f}",
            f"{1000 * span / steps:.0f}", f"{losses[0]:.4f}", f"{losses[-1]:.4f}"]


HEADERS = ["configuration (4 processes)", "params MiB/rank", "optim state MiB/rank",
           "peak RSS MiB/rank", "ms/step", "first loss", "last loss"]
