"""The ``xla`` strategy: data parallelism over the TPU cores of a host, one process each, started
by ``torch_xla.launch`` (torch_xla's documented multi-process launcher).

Each process trains a whole replica on its shard of the data (``DistributedSampler``, from
:class:`ptrain.distributed.ProcessGroupStrategy`); the ``tpu`` accelerator's
``xm.optimizer_step`` all-reduces the gradients before each step, so no DDP wrapper is used.
Metrics are reduced over torch.distributed's ``xla`` backend.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from ptrain import hookimpl
from ptrain.distributed import ProcessGroupStrategy
from ptrain_xla.accelerator import tpu_problem

_RESULT = "result.pkl"


def _xla_worker(index: int, payload: bytes, result_dir: str) -> None:
    import torch_xla.runtime as xr

    result = pickle.loads(payload)()
    if xr.global_ordinal() == 0:
        with open(os.path.join(result_dir, _RESULT), "wb") as f:
            pickle.dump(result, f)


class XLAStrategy(ProcessGroupStrategy):
    """``--strategy xla`` (with ``--accelerator tpu``)."""

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        ProcessGroupStrategy.add_process_group_options(options, launcher=False)

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        return tpu_problem()

    @hookimpl
    def launch(self, trainer, function: Callable[[], Any]) -> Any:
        import torch_xla

        with tempfile.TemporaryDirectory(prefix="ptrain-xla-") as result_dir:
            torch_xla.launch(_xla_worker, args=(pickle.dumps(function), result_dir))
            with open(Path(result_dir) / _RESULT, "rb") as f:
                return pickle.load(f)

    @hookimpl(wrapper=True)
    def setup_device(self, trainer):
        import torch_xla.runtime as xr

        trainer.global_rank, trainer.local_rank = xr.global_ordinal(), xr.local_ordinal()
        trainer.world_size = xr.world_size()
        device = yield
        if not dist.is_initialized():
            import torch_xla.distributed.xla_backend  # noqa: F401  registers the "xla" backend

            dist.init_process_group("xla", init_method="xla://")
        return device
