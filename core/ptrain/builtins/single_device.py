"""The ``single-device`` strategy: one process, one device, no wrapping."""

from __future__ import annotations

import os

from ptrain.errors import ConfigError
from ptrain.hookspecs import hookimpl


class SingleDeviceStrategy:
    """The default strategy: the loop's defaults as they are (the model moved to
    ``trainer.device``, no wrapping, no reduction); it only checks that one device was asked for,
    and that no launcher started this process as one of several."""

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
        launched = os.environ.get("WORLD_SIZE", "1")
        if launched.isdigit() and int(launched) > 1:
            raise ConfigError(
                f"this process was started as one of WORLD_SIZE={launched} processes (RANK="
                f"{os.environ.get('RANK', '?')}: by torchrun or a cluster's launcher), but the "
                f"single-device strategy trains in one process alone: each of the {launched} "
                f"would train the whole model by itself, into its own run folder. Choose a "
                f"multi-process strategy, which joins the launcher's processes (--strategy ddp "
                f"or fsdp), or start one process."
            )
        return None
