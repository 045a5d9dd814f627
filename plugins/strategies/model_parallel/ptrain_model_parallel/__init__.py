"""The ``model-parallel`` strategy: tensor parallelism x FSDP2 over one named device mesh.

The job's processes form the mesh ``dp_replicate x dp_shard x tp``. The module applies its
tensor-parallel plan in ``configure_model`` on ``self.device_mesh["tp"]``; the strategy shards
the result with FSDP2 over ``dp_replicate x dp_shard`` (hybrid sharding when replicated).
Checkpoints are ``fsdp``'s sharded folders (see :mod:`ptrain_fsdp.checkpoint`).
"""

from ptrain_model_parallel.strategy import ModelParallelStrategy

__all__ = ["ModelParallelStrategy"]
