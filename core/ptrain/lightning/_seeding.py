"""Lightning's seeding rule under several processes, for ``ptrain.lightning.Trainer`` runs
(:class:`ReseedEachStage`)."""

from __future__ import annotations

from typing import Any

from ptrain.hookspecs import hookimpl
from ptrain.seeding import last_seed, seed_everything


class ReseedEachStage:
    """The ptrain callback (in every ``ptrain.lightning.Trainer`` run) that seeds every process
    of a multi-process job again when a stage sets up its device, with the seed of the last
    ``seed_everything``, as Lightning's ddp, fsdp and deepspeed strategies do; without an
    earlier ``seed_everything`` it does nothing, as in Lightning. The data's ``prepare_data``
    and ``setup``, the model's configuration and the training then draw what they draw under
    Lightning. ptrain's own ``Trainer`` does not re-seed (each process goes on from where the
    program's seeding left it). A resumed fit still restores the generators its checkpoint
    holds, when its first epoch starts."""

    name = "lightning-reseed-each-stage"

    @hookimpl(wrapper=True)
    def setup_device(self, trainer: Any) -> Any:
        device = yield
        seed = last_seed()
        if trainer.world_size > 1 and seed is not None:
            seed_everything(seed)
        return device
