"""``lightning.pytorch.plugins``' names over ptrain's plugins.

- Precision objects (:mod:`.precision`) select ptrain's precision plugin of the same name:
  ``MixedPrecision("bf16-mixed", "cpu")`` is ``precision="bf16-mixed"``, ``DoublePrecision()``
  is ``"64-true"``, ``HalfPrecision("bf16-true")`` is ``"bf16-true"``; a ``GradScaler`` given to
  ``MixedPrecision("16-mixed", ...)`` gives its initial scale and growth interval to ptrain's
  loss scaler. ``FSDPPrecision``/``DeepSpeedPrecision``/``XLAPrecision`` select their precision
  under whichever strategy runs. A program's own subclass of ``Precision``, and quantized or
  FP8 training (``BitsandbytesPrecision``, ``TransformerEnginePrecision``), are refused.
- Checkpoint IO (:mod:`.io`): ``TorchCheckpointIO`` is what ptrain does anyway (``torch.save``,
  atomically). A program's own ``CheckpointIO`` subclass writes and reads the checkpoints of
  the run. ``AsyncCheckpointIO`` is refused, naming ptrain's own background writes (the checkpoint
  callback's ``async_save``).
- Layer sync (:mod:`.layer_sync`): ``TorchSyncBatchNorm`` (and a program's own ``LayerSync``)
  converts the model's layers before the strategy wraps it, when several processes train.
- Cluster environments (:mod:`.environments`): what ptrain reads anyway, or refused.
"""

from ptrain.lightning.plugins.io import (AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO,
                                         XLACheckpointIO)
from ptrain.lightning.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from ptrain.lightning.plugins.precision import (BitsandbytesPrecision, DeepSpeedPrecision,
                                                DoublePrecision, FSDPPrecision, HalfPrecision,
                                                MixedPrecision, Precision,
                                                TransformerEnginePrecision, XLAPrecision)

__all__ = ["AsyncCheckpointIO", "BitsandbytesPrecision", "CheckpointIO", "DeepSpeedPrecision",
           "DoublePrecision", "FSDPPrecision", "HalfPrecision", "LayerSync", "MixedPrecision",
           "Precision", "TorchCheckpointIO", "TorchSyncBatchNorm", "TransformerEnginePrecision",
           "XLACheckpointIO", "XLAPrecision"]
