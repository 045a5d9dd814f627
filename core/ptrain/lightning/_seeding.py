"""Lightning's seeding rule under several processes, for ``ptrain.lightning.Trainer`` runs
(:class:`ReseedEachStage`)."""

from __future__ import annotations

from typing import Any

from ptrain.hookspecs import hookimpl
from ptrain.seeding import last_seed, seed_everything


class ReseedEachStage:
    """The ptrain callback (in every ``ptrain.lightning.Trainer`` run) that seeds every process
    of a job under a multi-process strategy again when a stage sets up its device, with the
    seed of the last ``seed_everything``, as Lightning's ddp, fsdp and deepspeed strategies do,
    also when they run one process (``DDPStrategy`` with ``devices=1``); under
    ``single-device`` it does nothing, and without an earlier ``seed_everything`` neither, as
    in Lightning. The data's ``prepare_data``
    and ``setup``, the model's configuration and the training then draw what they draw under
    Lightning. ptrain's own ``Trainer`` does not re-seed (each process goes on from where the
    program's seeding left it). A resumed fit still restores the generators its checkpoint
    holds, when its first epoch starts."""

    name = "lightning-reseed-each-stage"

    @hookimpl(wrapper=True)
    def setup_device(self, trainer: Any) -> Any:
        device = yield
        seed = last_seed()
        if _runs_processes(trainer) and seed is not None:
            seed_everything(seed)
        return device


def _runs_processes(trainer: Any) -> bool:
    """Whether the run's strategy is one that runs a process per device (ddp, fsdp, zero,
    model-parallel), whatever the number of devices: Lightning's counterparts seed again when
    they set up, its single-device strategy does not."""
    strategy = trainer.plugins.get(trainer.options["strategy"])
    return callable(getattr(strategy, "processes_per_node", None))
