"""Lightning's private ``_AcceleratorConnector``, as far as packages read it: scvi-tools
resolves its ``train(accelerator=, devices=)`` arguments with
``_AcceleratorConnector(accelerator=..., devices=...)`` and reads the resolved
``_accelerator_flag`` and ``_devices_flag`` (``parse_device_args``), before any Trainer exists.
"""

from __future__ import annotations

from typing import Any

from ptrain.errors import ConfigError

__all__ = ["_AcceleratorConnector"]


class _AcceleratorConnector:
    """``accelerator`` and ``devices`` resolved as a ``ptrain.lightning.Trainer`` given them
    would run them, in Lightning's forms:

    - ``_accelerator_flag``: the accelerator's name (``"auto"`` -> the one ptrain's
      ``--accelerator auto`` selects here, ``"gpu"`` -> ``"mps"`` where available, else
      ``"cuda"``), or the :class:`~ptrain.lightning.accelerators.Accelerator` object given;
    - ``_devices_flag``: ``devices`` as that accelerator's ``parse_devices`` reads it, with
      ``"auto"`` meaning its ``auto_device_count()`` (a count of CPU processes, a list of
      indices for numbered devices).

    Lightning's other arguments (strategy, precision, ...) are refused: nothing here reads
    them. An accelerator that can't run here is a :class:`ptrain.ConfigError`, as Lightning
    refuses it with a ``MisconfigurationException`` (the same class in ``ptrain.lightning``)."""

    def __init__(self, accelerator: Any = "auto", devices: Any = "auto",
                 **unread: Any) -> None:
        from ptrain.lightning.accelerators import Accelerator, AcceleratorRegistry

        if unread:
            raise ConfigError(
                f"ptrain.lightning's _AcceleratorConnector resolves accelerator and devices "
                f"only; {', '.join(sorted(unread))} would not be read. Give those to the "
                f"Trainer, which runs them.")
        if isinstance(accelerator, Accelerator):
            self._accelerator_flag: Any = accelerator
        else:
            self._accelerator_flag = _resolved_name(accelerator)
            accelerator = AcceleratorRegistry.get(self._accelerator_flag)
        if not accelerator.is_available():
            raise ConfigError(f"accelerator {self._accelerator_flag!r} can't run on this "
                              f"machine.")
        self._devices_flag = accelerator.parse_devices(
            accelerator.auto_device_count() if devices == "auto" else devices)


def _resolved_name(accelerator: Any) -> str:
    from ptrain.catalog import Catalog
    from ptrain.config import canonical_plugin_name
    from ptrain.lightning.accelerators import AcceleratorRegistry, gpu_accelerator_name
    from ptrain.selection import auto_accelerator

    if accelerator in AcceleratorRegistry.user_registered:
        return accelerator
    if accelerator == "gpu":
        return gpu_accelerator_name()
    name = canonical_plugin_name("accelerator", accelerator)
    return name if name != "auto" else auto_accelerator(Catalog.discover(), set()).name
