"""torchao's float8 training API, imported on first use and quietly."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from ptrain import PluginError

#: loggers that speak while torchao is imported: torchao names the kernel libraries for other
#: hardware it could not load (mxfp8, CUTLASS for sm_90a; float8 training needs neither), and
#: torch's pytree warns about a registration torchao makes. Neither is about the user's run.
_NOISY_ON_IMPORT = ("torchao", "torch.utils._pytree")


def float8_training() -> SimpleNamespace:
    """``Float8LinearConfig``, ``Float8Linear``, ``convert_to_float8_training``,
    ``WeightWithDynamicFloat8CastTensor`` (a weight under float8 all-gather) and the
    tensor-parallel styles ``Float8ColwiseParallel``, ``Float8RowwiseParallel`` from torchao, with the notes above kept off the terminal; a :class:`ptrain.PluginError`
    naming the fix where torchao can't be imported."""
    loggers = [logging.getLogger(name) for name in _NOISY_ON_IMPORT]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear
        from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor
        from torchao.float8.float8_tensor_parallel import (Float8ColwiseParallel,
                                                           Float8RowwiseParallel)
    except ImportError as error:
        raise PluginError(
            f"--precision fp8-mixed trains through torchao's float8 layers, and torchao can't "
            f"be imported here ({error}). Install it with torch pinned: pip install "
            f"'torchao>=0.18,<0.19' -c constraints.txt (ptrain-fp8-precision requires it).") \
            from error
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    return SimpleNamespace(Float8LinearConfig=Float8LinearConfig, Float8Linear=Float8Linear,
                           WeightWithDynamicFloat8CastTensor=WeightWithDynamicFloat8CastTensor,
                           convert_to_float8_training=convert_to_float8_training,
                           Float8ColwiseParallel=Float8ColwiseParallel,
                           Float8RowwiseParallel=Float8RowwiseParallel)
