"""The ``hpu`` accelerator: Intel Gaudi (Habana) cards through ``habana_frameworks.torch``,
written to Intel Gaudi's documented PyTorch API.

- The device is ``torch.device("hpu")``; importing ``habana_frameworks.torch.core`` registers it.
- In lazy mode (the default here; ``--hpu-lazy-mode`` / ``PT_HPU_LAZY_MODE``) operations are
  accumulated into a graph that runs at ``htcore.mark_step()``: it is called after every
  backward pass, after every optimizer step and after every validation batch, as Gaudi's
  training recipe has it.
- Multi-card training uses the ``ddp`` strategy; the collective library is HCCL (this plugin's
  ``process_group_backend``), registered by importing ``habana_frameworks.torch.distributed.hccl``.

Listing and availability checks import nothing of ``habana_frameworks``.
"""

from __future__ import annotations

import glob
import importlib.util
from typing import Any

import torch

from ptrain import PluginError, hookimpl
from ptrain.data import move_to_device
from ptrain.options import to_bool


def hpu_problem() -> str | None:
    """Why the ``hpu`` accelerator can't run here, or ``None``; imports nothing."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return ("habana_frameworks is not installed: install Intel Gaudi's PyTorch packages "
                "(https://docs.habana.ai/en/latest/Installation_Guide/)")
    if not (glob.glob("/dev/accel/accel*") or glob.glob("/dev/hl[0-9]*")):
        return ("habana_frameworks is installed but no Gaudi device was found here (no "
                "/dev/accel/accel* or /dev/hl* device)")
    return None


def _mark_step() -> None:
    import habana_frameworks.torch.core as htcore

    htcore.mark_step()


class HPUAccelerator:
    """``--accelerator hpu``; ``auto`` prefers it to the CPU where a Gaudi card is present."""

    priority = 80
    process_group_backend = "hccl"

    def __init__(self, lazy_mode: bool = True):
        self.lazy_mode = lazy_mode

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("lazy_mode", to_bool, default=True,
                    help="mark step boundaries for Gaudi's lazy mode (turn off when running "
                         "with PT_HPU_LAZY_MODE=0, eager or torch.compile)")

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        return hpu_problem()

    @staticmethod
    def auto_device_count() -> int:
        import habana_frameworks.torch.hpu as hthpu

        return hthpu.device_count()

    @hookimpl
    def setup_device(self, trainer) -> torch.device:
        problem = hpu_problem()
        if problem is not None:
            raise PluginError(f"--accelerator hpu can't run here: {problem}. Use --accelerator "
                              f"cpu, or auto to take the best available.")
        import habana_frameworks.torch.core  # noqa: F401  registers the hpu device

        if trainer.world_size > 1:
            import habana_frameworks.torch.distributed.hccl  # noqa: F401  the hccl backend
        return torch.device("hpu")

    @hookimpl
    def transfer_batch(self, trainer, batch: Any) -> Any:
        return move_to_device(batch, trainer.device)

    @hookimpl(wrapper=True)
    def backward(self):
        done = yield
        if self.lazy_mode:
            _mark_step()
        return done

    @hookimpl(wrapper=True)
    def optimizer_step(self):
        done = yield
        if self.lazy_mode:
            _mark_step()
        return done

    @hookimpl(wrapper=True)
    def model_step(self, stage: str):
        output = yield
        if self.lazy_mode and stage == "validate":
            _mark_step()
        return output
