"""The ``tpu`` accelerator, written to torch_xla's documented API (2.x):

- the device is ``torch_xla.device()``;
- XLA records operations lazily and compiles them at a step boundary: ``torch_xla.sync()``
  (``xm.mark_step()`` before torch_xla 2.6) ends every training batch and every validation
  batch, so one graph is compiled per step shape and reused;
- the optimizer steps through ``xm.optimizer_step``, which also all-reduces the gradients across
  TPU cores when the ``xla`` strategy runs several (and no DDP wrapper does it);
- checkpoints are moved to host memory before they are written.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any

import torch

from ptrain import PluginError, hookimpl
from ptrain.data import apply_to_tensors, move_to_device


def tpu_problem() -> str | None:
    """Why the ``tpu`` accelerator can't run here, or ``None``; imports nothing."""
    if importlib.util.find_spec("torch_xla") is None:
        return ("torch_xla is not installed: pip install 'torch_xla[tpu]' (the release that "
                f"matches torch {torch.__version__.split('+')[0]}; see "
                "https://github.com/pytorch/xla#installation)")
    if not (_tpu_device_present() or any(os.environ.get(k) for k in _TPU_VARIABLES)):
        return ("torch_xla is installed but no TPU was found here (no /dev/accelN device, no "
                "Google PCI device, TPU_NAME unset)")
    return None


_TPU_VARIABLES = ("TPU_NAME", "TPU_ACCELERATOR_TYPE")
_GOOGLE_PCI_VENDOR = "0x1ae0"


def _tpu_device_present() -> bool:
    # TPU v2-v4 VMs: /dev/accel0.. (files; Gaudi's /dev/accel/ is a folder and does not match);
    # v5 and later: VFIO devices whose PCI vendor is Google.
    if glob.glob("/dev/accel[0-9]*"):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if open(vendor).read().strip() == _GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def _sync() -> None:
    import torch_xla

    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:  # torch_xla < 2.6
        import torch_xla.core.xla_model as xm

        xm.mark_step()


class TPUAccelerator:
    """``--accelerator tpu``; ``auto`` prefers it to the CPU where a TPU is present."""

    priority = 90
    process_group_backend = "xla"

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        return tpu_problem()

    @staticmethod
    def auto_device_count() -> int:
        import torch_xla

        return torch_xla.device_count()

    @hookimpl
    def setup_device(self) -> torch.device:
        problem = tpu_problem()
        if problem is not None:
            raise PluginError(f"--accelerator tpu can't run here: {problem}. Use --accelerator "
                              f"cpu, or auto to take the best available.")
        import torch_xla

        return torch_xla.device()

    @hookimpl
    def transfer_batch(self, trainer, batch: Any) -> Any:
        return move_to_device(batch, trainer.device)

    @hookimpl(wrapper=True)
    def model_step(self, stage: str):
        output = yield
        if stage == "validate":  # no optimizer step ends a validation batch
            _sync()
        return output

    @hookimpl
    def optimizer_step(self, trainer, optimizer: torch.optim.Optimizer) -> bool:
        from torch.nn.parallel import DistributedDataParallel

        if trainer.world_size > 1 and not isinstance(trainer.model, DistributedDataParallel):
            import torch_xla.core.xla_model as xm

            xm.optimizer_step(optimizer)  # all-reduces the gradients across cores, then steps
        else:
            optimizer.step()
        return True

    @hookimpl
    def on_train_batch_end(self) -> None:
        _sync()

    @hookimpl(tryfirst=True)
    def save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # before whoever writes it: XLA tensors become host tensors (and are materialised)
        checkpoint.update(apply_to_tensors(checkpoint, lambda t: t.cpu()))
