"""The ``cuda`` accelerator: NVIDIA GPUs (and ROCm GPUs through torch's CUDA API).

Each process is bound to one GPU: its local rank's entry of ``--devices`` when that is a list
of indices, else the GPU numbered by its local rank. Batches are copied from pinned host memory
without blocking the host. Options switch on cuDNN's autotuner, TF32 / bfloat16 matrix
multiplication for float32 (``float32_matmul_precision``; this is the one place ptrain sets it),
the caching allocator's expandable segments, and a memory-history snapshot for PyTorch's memory
visualizer. Device memory figures are logged at the end of every epoch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ptrain import ConfigError, PluginError, hookimpl
from ptrain.data import move_to_device, rebuild_dataloader
from ptrain.options import to_bool

_GIB = 1024**3


class CUDAAccelerator:
    """``--accelerator cuda``; ``auto`` prefers it to every other accelerator when a GPU is
    visible."""

    priority = 100
    process_group_backend = "nccl"

    def __init__(self, cudnn_benchmark: bool | None = None,
                 float32_matmul_precision: str | None = None,
                 expandable_segments: bool = False, pin_memory: bool = True,
                 memory_snapshot: str | None = None, memory_snapshot_entries: int = 100_000):
        self.cudnn_benchmark = cudnn_benchmark
        self.float32_matmul_precision = float32_matmul_precision
        self.expandable_segments = expandable_segments
        self.pin_memory = pin_memory
        self.memory_snapshot = memory_snapshot
        self.memory_snapshot_entries = memory_snapshot_entries
        self.snapshot_path: Path | None = None
        self._restore: list[tuple[Any, Any]] = []  # (setter, previous value) for teardown

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("cudnn_benchmark", to_bool,
                    help="let cuDNN time its algorithms on the first batches and keep the "
                         "fastest (helps convolutions with fixed input shapes). Default: leave "
                         "torch's setting")
        options.add("float32_matmul_precision", str, choices=("highest", "high", "medium"),
                    help="highest: true float32 matmuls; high: TF32 tensor cores (Ampere and "
                         "later); medium: bfloat16 passes. Default: leave torch's setting")
        options.add("expandable_segments", to_bool, default=False,
                    help="the caching allocator grows segments instead of adding new ones "
                         "(less fragmentation with changing shapes)")
        options.add("pin_memory", to_bool, default=True,
                    help="load batches into pinned host memory so copies to the GPU do not "
                         "block the host")
        options.add("memory_snapshot", str,
                    help="record the allocator's history and write a snapshot to this file "
                         "(relative: in the run folder) at the end, for "
                         "https://pytorch.org/memory_viz")
        options.add("memory_snapshot_entries", int, default=100_000,
                    help="how many allocation events the snapshot keeps")

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        if torch.version.cuda is None and torch.version.hip is None:
            return (f"this torch {torch.__version__} is a CPU-only build: install a CUDA build "
                    f"of torch (https://pytorch.org/get-started/locally/)")
        if torch.cuda.device_count() == 0:
            return ("torch has CUDA support but sees no GPU here (check nvidia-smi and "
                    "CUDA_VISIBLE_DEVICES)")
        return None

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        """On a run that trains on CUDA: cuDNN's benchmark mode (same numbers: it only chooses
        among algorithms) and TF32 matmuls for float32 (changed numbers)."""
        if "cuda" not in trainer.plugins:
            return []
        from ptrain.tuning import Candidate

        own = trainer.config["plugins"].get("cuda", {})
        offered = []
        if not own.get("cudnn_benchmark"):
            offered.append(Candidate("cudnn benchmark", "cudnn-benchmark",
                                     plugin_options={"cuda": {"cudnn_benchmark": True}}))
        if own.get("float32_matmul_precision") in (None, "highest") and \
                trainer.options.get("precision") == "32-true":
            offered.append(Candidate("tf32 matmuls", "matmul-precision", plugin_options={
                "cuda": {"float32_matmul_precision": "high"}}, numerics="changed"))
        return offered

    @staticmethod
    def auto_device_count() -> int:
        """What ``--devices auto`` means: every visible GPU."""
        return torch.cuda.device_count()

    # -- start-up ----------------------------------------------------------------------------

    @staticmethod
    def device_index(devices: Any, local_rank: int) -> int:
        """The GPU of the process with ``local_rank``: its entry of a list of indices, else the
        GPU numbered by the local rank."""
        if isinstance(devices, list):
            if local_rank >= len(devices):
                raise ConfigError(f"--devices {','.join(map(str, devices))} lists "
                                  f"{len(devices)} GPUs, but this is local process {local_rank}.")
            return devices[local_rank]
        return local_rank

    @hookimpl
    def setup_device(self, trainer) -> torch.device:
        problem = self.check_available()
        if problem is not None:
            raise PluginError(f"--accelerator cuda can't run here: {problem}. Use --accelerator "
                              f"cpu, or auto to take the best available.")
        index = self.device_index(trainer.devices, trainer.local_rank)
        count = torch.cuda.device_count()
        if not 0 <= index < count:
            raise ConfigError(f"--devices {trainer.devices} asks for GPU {index}, but {count} "
                              f"GPU(s) are visible here (indices 0-{count - 1}); give a count "
                              f"up to {count}, or existing indices.")
        if self.expandable_segments:
            _enable_expandable_segments()
        torch.cuda.set_device(index)
        # process-wide settings: changed only when asked, and put back at teardown
        if self.cudnn_benchmark is not None:
            self._restore.append((_set_cudnn_benchmark, torch.backends.cudnn.benchmark))
            torch.backends.cudnn.benchmark = self.cudnn_benchmark
        if self.float32_matmul_precision is not None:
            self._restore.append((torch.set_float32_matmul_precision,
                                  torch.get_float32_matmul_precision()))
            torch.set_float32_matmul_precision(self.float32_matmul_precision)
        if self.memory_snapshot is not None:
            torch.cuda.memory._record_memory_history(max_entries=self.memory_snapshot_entries)
        torch.cuda.reset_peak_memory_stats(index)
        return torch.device("cuda", index)

    @hookimpl(wrapper=True)
    def prepare_dataloader(self):
        loader = yield
        if self.pin_memory and isinstance(loader, DataLoader) and not loader.pin_memory:
            return rebuild_dataloader(loader, pin_memory=True)
        return loader

    # -- per step ------------------------------------------------------------------------------

    @hookimpl
    def transfer_batch(self, trainer, batch: Any) -> Any:
        # from pinned memory the copy is asynchronous; the kernels that use it queue behind it
        return move_to_device(batch, trainer.device, non_blocking=True)

    # -- per epoch, end ------------------------------------------------------------------------

    @hookimpl
    def on_epoch_end(self, trainer) -> None:
        stats = torch.cuda.memory_stats(trainer.device)
        figures = torch.tensor([stats.get("allocated_bytes.all.current", 0),
                                stats.get("allocated_bytes.all.peak", 0),
                                stats.get("reserved_bytes.all.current", 0)],
                               dtype=torch.float64, device=trainer.device) / _GIB
        reduced = trainer.hook.reduce_metrics(trainer=trainer, metrics={"m": figures},
                                              op="max")["m"].tolist()
        names = ("cuda_memory_allocated_gib", "cuda_memory_peak_gib", "cuda_memory_reserved_gib")
        trainer.hook.log_metrics(trainer=trainer, metrics=dict(zip(names, reduced)),
                                 step=trainer.global_step)

    @hookimpl
    def teardown(self, trainer) -> None:
        while self._restore:
            setter, previous = self._restore.pop()
            setter(previous)
        if self.memory_snapshot is None or not torch.cuda.is_initialized():
            return
        path = Path(self.memory_snapshot)
        if not path.is_absolute() and trainer.run_dir is not None:
            path = Path(trainer.run_dir) / path
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.snapshot_path = path


def _set_cudnn_benchmark(value: bool) -> None:
    torch.backends.cudnn.benchmark = value


def _enable_expandable_segments() -> None:
    if not torch.cuda.is_initialized():  # read when the allocator starts
        settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "expandable_segments" not in settings:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(
                filter(None, [settings, "expandable_segments:True"]))
    else:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
