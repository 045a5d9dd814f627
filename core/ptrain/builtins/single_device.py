"""The ``single-device`` strategy: one process, one device, no wrapping."""

from __future__ import annotations

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl


class SingleDeviceStrategy:
    """The default strategy: the loop's defaults as they are (the model moved to
    ``trainer.device``, no wrapping, no reduction); it only checks that one device was asked for."""

    @hookimpl
    def launch(self, trainer) -> None:
        devices = trainer.devices
        one = devices in (1, "auto") or (isinstance(devices, list) and len(devices) == 1)
        if trainer.num_nodes != 1 or not one:
            raise ConfigError(
                f"the single-device strategy trains on one device in one process, but "
                f"--devices {devices} --num-nodes {trainer.num_nodes} asks for more; choose a "
                f"multi-process strategy (e.g. --strategy ddp) or --devices 1."
            )
        return None
