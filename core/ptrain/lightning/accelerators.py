"""``lightning.pytorch.accelerators``' names over ptrain's accelerator plugins.

``Trainer(accelerator=CUDAAccelerator())`` is ``Trainer(accelerator="cuda")``: each of
Lightning's accelerator classes stands for the ptrain accelerator plugin of the same device
(``CPUAccelerator`` -> ``cpu``, ``CUDAAccelerator`` -> ``cuda``, ``MPSAccelerator`` -> ``mps``,
``XLAAccelerator`` -> ``tpu``), and its static methods (``is_available``,
``auto_device_count``, ``parse_devices``, ``get_parallel_devices``) answer from that plugin.
A program's own subclass of :class:`Accelerator` (Lightning's way of adding a device) runs as a
ptrain accelerator plugin: its ``setup_device``, ``get_parallel_devices``, ``teardown`` are
called where Lightning calls them. ``AcceleratorRegistry`` lists the installed ptrain
accelerators, under their ptrain names, and what a program registers.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ptrain.hookspecs import hookimpl
from ptrain.lightning._registries import Registry, installed_plugin, plugin_available

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator",
           "XLAAccelerator", "find_usable_cuda_devices"]


class Accelerator:
    """The base of Lightning's accelerators. A subclass written for a new device overrides
    ``setup_device(device)``, ``teardown()``, and the static ``parse_devices(devices)``,
    ``get_parallel_devices(devices)``, ``auto_device_count()``, ``is_available()``; given to
    the Trainer it becomes a ptrain accelerator plugin (:meth:`ptrain_plugin`). The subclasses
    below stand for ptrain's own accelerator plugins instead (``ptrain_name``)."""

    #: the ptrain accelerator plugin this class stands for (None: a program's own accelerator)
    ptrain_name: str | None = None
    #: the backend of torch.distributed for multi-process strategies on this device
    process_group_backend = "gloo"

    def setup_device(self, device: torch.device) -> None:
        """Prepare ``device`` for this process before the model is moved there."""

    def teardown(self) -> None:
        """Clean up at the end of a stage."""

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        """The ``devices`` flag in the form :meth:`get_parallel_devices` takes."""
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """One ``torch.device`` per process, from :meth:`parse_devices`' result."""
        raise NotImplementedError

    @staticmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` means."""
        return 1

    @staticmethod
    def is_available() -> bool:
        raise NotImplementedError

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Figures about ``device`` worth logging (empty when there are none)."""
        return {}

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Lightning's hook for a class to register itself under its names."""

    def ptrain_plugin(self, name: str) -> Any:
        """This accelerator as a ptrain accelerator plugin registered under ``name`` (for a
        program's own subclass; Lightning's classes select ``ptrain_name`` instead)."""
        return _AcceleratorPlugin(self, name)


class _PtrainAccelerator(Accelerator):
    """A Lightning accelerator class standing for ptrain's accelerator ``ptrain_name``."""

    @classmethod
    def _plugin(cls) -> Any:
        return installed_plugin("accelerator", cls.ptrain_name)

    @classmethod
    def is_available(cls) -> bool:  # type: ignore[override]
        """Whether ptrain's accelerator plugin is installed and can run here."""
        return plugin_available("accelerator", cls.ptrain_name)

    @classmethod
    def auto_device_count(cls) -> int:  # type: ignore[override]
        """What ``devices="auto"`` means: the plugin's ``auto_device_count()`` (0 when it is
        not available here), or 1 for a plugin that does not say."""
        if not cls.is_available():
            return 0
        count = getattr(cls._plugin(), "auto_device_count", None)
        return int(count()) if callable(count) else 1

    @classmethod
    def name(cls) -> str:
        return cls.ptrain_name

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register(cls.ptrain_name, cls, description=cls.__name__)


class CPUAccelerator(_PtrainAccelerator):
    """ptrain's ``cpu`` accelerator."""

    ptrain_name = "cpu"

    @staticmethod
    def parse_devices(devices: Any) -> int:
        """A number of CPU processes: an int, its text, or ``"auto"`` (1)."""
        if devices == "auto":
            return 1
        if isinstance(devices, str) and devices.strip().isdigit():
            devices = int(devices)
        if isinstance(devices, bool) or not isinstance(devices, int) or devices <= 0:
            raise TypeError(f"`devices` selected with `CPUAccelerator` should be an int > 0, got "
                            f"{devices!r}.")
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("cpu")] * CPUAccelerator.parse_devices(devices)

    def get_device_stats(self, device: Any) -> dict[str, float]:
        """The host's memory, CPU and swap use in percent (needs ``psutil``)."""
        try:
            import psutil
        except ImportError:
            raise ModuleNotFoundError("CPUAccelerator.get_device_stats reads the host's figures "
                                      "with psutil, which is not installed: pip install psutil"
                                      ) from None
        return {"cpu_vm_percent": psutil.virtual_memory().percent,
                "cpu_percent": psutil.cpu_percent(),
                "cpu_swap_percent": psutil.swap_memory().percent}


class _IndexedDevices(_PtrainAccelerator):
    """Accelerators whose devices are numbered: ``devices`` is a count, ``"auto"``, ``-1`` (all),
    a list of indices or their text (``"0,2"``)."""

    device_type = "cuda"

    @classmethod
    def parse_devices(cls, devices: Any) -> list[int]:  # type: ignore[override]
        available = cls.auto_device_count()
        if devices in ("auto", -1, "-1"):
            return list(range(available))
        if isinstance(devices, str):
            devices = ([int(d) for d in devices.split(",") if d.strip()] if "," in devices
                       else int(devices))
        if isinstance(devices, int) and not isinstance(devices, bool):
            devices = list(range(devices))
        wanted = list(devices)
        missing = [d for d in wanted if not 0 <= d < available]
        if missing:
            raise ValueError(f"{cls.__name__}: devices {missing} were requested, but this "
                             f"machine has {available} ({', '.join(map(str, range(available)))}"
                             f")." if available else
                             f"{cls.__name__}: devices {wanted} were requested, but ptrain's "
                             f"{cls.ptrain_name!r} accelerator sees none here.")
        return wanted

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:  # type: ignore[override]
        return [torch.device(cls.device_type, i) for i in devices]


class CUDAAccelerator(_IndexedDevices):
    """ptrain's ``cuda`` accelerator (NVIDIA and ROCm GPUs)."""

    ptrain_name = "cuda"
    device_type = "cuda"
    process_group_backend = "nccl"

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """``torch.cuda.memory_stats(device)``."""
        return torch.cuda.memory_stats(device)


class MPSAccelerator(_IndexedDevices):
    """ptrain's ``mps`` accelerator (Apple GPUs)."""

    ptrain_name = "mps"
    device_type = "mps"


class XLAAccelerator(_IndexedDevices):
    """ptrain's ``tpu`` accelerator (``ptrain-xla``; Lightning's ``"tpu"`` too)."""

    ptrain_name = "tpu"
    device_type = "xla"


#: Lightning's accelerator classes by the ptrain plugin they stand for
_CLASSES = {cls.ptrain_name: cls for cls in (CPUAccelerator, CUDAAccelerator, MPSAccelerator,
                                             XLAAccelerator)}


@functools.lru_cache(maxsize=None)
def _named_accelerator(ptrain_name: str) -> type[_PtrainAccelerator]:
    """The class standing for an installed ptrain accelerator Lightning has no class for
    (``hpu``, a third party's): one per name, since the answers are class methods."""
    return type(f"{ptrain_name.upper()}Accelerator", (_PtrainAccelerator,),
                {"ptrain_name": ptrain_name, "__module__": __name__,
                 "__doc__": f"ptrain's ``{ptrain_name}`` accelerator."})


class _AcceleratorPlugin:
    """A program's own :class:`Accelerator` as a ptrain accelerator plugin: the process's device
    is the entry of ``get_parallel_devices(parse_devices(devices))`` at its local rank (for
    ``devices="auto"``, ``auto_device_count()`` devices); ``setup_device`` prepares it and
    batches are moved there."""

    def __init__(self, accelerator: Accelerator, name: str):
        self.accelerator, self.name = accelerator, name
        self.process_group_backend = accelerator.process_group_backend

    def auto_device_count(self) -> int:
        return self.accelerator.auto_device_count()

    @hookimpl
    def setup_device(self, trainer: Any) -> torch.device:
        devices = trainer.devices
        if devices == "auto":
            devices = self.accelerator.auto_device_count()
        parallel = self.accelerator.get_parallel_devices(self.accelerator.parse_devices(devices))
        device = parallel[trainer.local_rank]
        self.accelerator.setup_device(device)
        return device

    @hookimpl
    def transfer_batch(self, trainer: Any, batch: Any) -> Any:
        from ptrain.lightning.utilities.transfer import move_data_to_device

        return move_data_to_device(batch, trainer.device)

    @hookimpl
    def teardown(self) -> None:
        self.accelerator.teardown()


def _fill(registry: Registry) -> None:
    from ptrain.catalog import Catalog

    catalog = Catalog.discover()
    for name in catalog.names("accelerator"):
        info = catalog.get("accelerator", name)
        cls = _CLASSES.get(name)
        description = f"ptrain's {name!r} accelerator ({info.distribution} {info.version})"
        if cls is not None:
            registry[name] = {"description": description, "init_params": {},
                              "accelerator": cls, "accelerator_name": name}
        else:
            registry[name] = {"description": description, "init_params": {},
                              "accelerator": _named_accelerator(name), "accelerator_name": name}


class _AcceleratorRegistry(Registry):
    value_key, name_key, what = "accelerator", "accelerator_name", "accelerator"

    def available_accelerators(self) -> set[str]:
        """The names ``Trainer(accelerator=...)`` takes besides ``"auto"`` and ``"gpu"``."""
        return set(self.keys())


#: name -> the accelerator it selects: ptrain's installed accelerator plugins, and what a
#: program registers (``AcceleratorRegistry.register("mine", MyAccelerator)``, then
#: ``Trainer(accelerator="mine")``)
AcceleratorRegistry = _AcceleratorRegistry(_fill)


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """The indices of ``num_devices`` visible GPUs that take a tensor now (``-1``: every one
    that does), trying each in order; a GPU that another process holds in exclusive mode does
    not. ``[]`` for 0. A ``ValueError`` when there are no visible GPUs or fewer than asked
    for, a ``RuntimeError`` when too few of them are free."""
    if num_devices == 0:
        return []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        raise ValueError(f"You requested to find {num_devices} devices but there are no visible "
                         f"CUDA devices on this machine.")
    if num_devices > visible:
        raise ValueError(f"You requested to find {num_devices} devices but this machine only has "
                         f"{visible} GPUs.")
    usable, occupied = [], []
    for index in range(visible):
        try:
            torch.tensor(0, device=torch.device("cuda", index))
        except RuntimeError:
            occupied.append(index)
            continue
        usable.append(index)
        if len(usable) == num_devices:
            break
    if num_devices != -1 and len(usable) != num_devices:
        raise RuntimeError(f"You requested to find {num_devices} devices but only {len(usable)} "
                           f"are currently available. The devices {occupied} are occupied by "
                           f"other processes and can't be used at the moment.")
    return usable


def gpu_accelerator_name() -> str:
    """What Lightning's ``accelerator="gpu"`` means on this machine: ``"mps"`` where Apple's
    GPU is available, else ``"cuda"`` (whose plugin says why it can't run, where it can't)."""
    return "mps" if MPSAccelerator.is_available() else "cuda"


def ptrain_accelerator(value: Any) -> Any:
    """What ``Trainer(accelerator=value)`` selects in ptrain: a name (ptrain's own, Lightning's
    alias, ``"gpu"`` as :func:`gpu_accelerator_name` reads it, or a name registered in
    :data:`AcceleratorRegistry` by the program, made into a plugin), or the plugin an
    :class:`Accelerator` object stands for. Anything else is returned as it is, for ptrain to
    judge (a ptrain plugin object)."""
    if isinstance(value, str) and value in AcceleratorRegistry.user_registered:
        value = AcceleratorRegistry.get(value)
    if value == "gpu":
        return gpu_accelerator_name()
    if isinstance(value, Accelerator):
        if value.ptrain_name is not None:
            return value.ptrain_name
        from ptrain.selection import object_name

        return value.ptrain_plugin(object_name(value))
    return value


def lightning_accelerator(trainer: Any) -> Accelerator:
    """Lightning's ``trainer.accelerator``: the :class:`Accelerator` of the run's accelerator
    plugin (a program's own object where it gave one)."""
    name, plugin = next(iter(trainer.plugins.items()))  # the accelerator is selected first
    if isinstance(plugin, _AcceleratorPlugin):
        return plugin.accelerator
    cls = _CLASSES.get(name)
    return (cls if cls is not None else _named_accelerator(name))()
