"""Smoke uses of ``ptrain.lightning.accelerators``."""

from __future__ import annotations

import pytest
import torch

from lightning_names._components import fit, trainer
from ptrain.errors import PluginError
from ptrain.lightning import accelerators as a


class HostAccelerator(a.Accelerator):
    """A program's own accelerator (here: the host, with a record of what was called)."""

    calls: list[str] = []

    def setup_device(self, device):
        self.calls.append(f"setup_device:{device}")

    def teardown(self):
        self.calls.append("teardown")

    @staticmethod
    def parse_devices(devices):
        return int(devices)

    @staticmethod
    def get_parallel_devices(devices):
        return [torch.device("cpu")] * devices

    @staticmethod
    def auto_device_count():
        return 1

    @staticmethod
    def is_available():
        return True


def _own_accelerator():
    HostAccelerator.calls = []
    run, _ = fit(accelerator=HostAccelerator(), devices=1)
    assert HostAccelerator.calls == ["setup_device:cpu", "teardown"]
    assert run.global_step == 4 and isinstance(run.accelerator, HostAccelerator)


def _registry():
    assert {"cpu", "cuda", "mps", "tpu"} <= a.AcceleratorRegistry.available_accelerators()
    assert isinstance(a.AcceleratorRegistry.get("cpu"), a.CPUAccelerator)
    # an installed ptrain accelerator Lightning has no class for answers as its plugin (its
    # class's answers read the name: a traceback when the object alone held it)
    hpu = type(a.AcceleratorRegistry.get("hpu"))
    assert hpu.name() == "hpu"
    _device_accelerator(hpu, hpu.is_available())
    a.AcceleratorRegistry.register("host", HostAccelerator, description="the host")
    try:
        HostAccelerator.calls = []
        run, _ = fit(accelerator="host", devices=1)
        assert HostAccelerator.calls[0] == "setup_device:cpu" and run.global_step == 4
    finally:
        a.AcceleratorRegistry.remove("host")
    assert "host" not in a.AcceleratorRegistry


def _cpu():
    run, module = fit(accelerator=a.CPUAccelerator())
    assert run.options["accelerator"] == "cpu" and isinstance(run.accelerator, a.CPUAccelerator)
    assert module.device == torch.device("cpu") and run.global_step == 4
    assert a.CPUAccelerator.is_available() and a.CPUAccelerator.auto_device_count() == 1
    assert a.CPUAccelerator.get_parallel_devices(2) == [torch.device("cpu")] * 2


def _device_accelerator(cls, available):
    assert cls.is_available() == available
    if available:
        fit(accelerator=cls(), devices=1)
    else:
        assert cls.auto_device_count() == 0
        with pytest.raises(PluginError, match=f"{cls.ptrain_name!r} can't run on this machine"):
            trainer(accelerator=cls())


def _cuda():
    _device_accelerator(a.CUDAAccelerator, torch.cuda.is_available())


def _mps():
    _device_accelerator(a.MPSAccelerator, torch.backends.mps.is_available())


def _xla():
    import importlib.util

    _device_accelerator(a.XLAAccelerator, a.XLAAccelerator.is_available())
    if importlib.util.find_spec("torch_xla") is None:
        assert not a.XLAAccelerator.is_available()


def _find_usable_cuda_devices():
    assert a.find_usable_cuda_devices(0) == []
    if torch.cuda.device_count() == 0:
        with pytest.raises(ValueError, match="no visible CUDA devices"):
            a.find_usable_cuda_devices()
    else:
        assert a.find_usable_cuda_devices(1) == [0] or len(a.find_usable_cuda_devices(1)) == 1


SMOKE = {
    "Accelerator": _own_accelerator,
    "AcceleratorRegistry": _registry,
    "CPUAccelerator": _cpu,
    "CUDAAccelerator": _cuda,
    "MPSAccelerator": _mps,
    "XLAAccelerator": _xla,
    "find_usable_cuda_devices": _find_usable_cuda_devices,
}
