"""The ``fsdp`` strategy on FSDP2 (``torch.distributed.fsdp.fully_shard``).

Parameters, gradients and optimizer state are sharded across the ranks; each sharded module's
parameters are gathered just before its forward (and backward) and freed after. Sharded modules
are those of the classes ``wrap_classes`` names, then the whole model. Checkpoints are sharded
folders written with ``torch.distributed.checkpoint`` (see :mod:`ptrain_fsdp.checkpoint`).
"""

from ptrain_fsdp.strategy import FSDPStrategy

__all__ = ["FSDPStrategy"]
