"""What the active precision plugin tells the rest of the run about numeric formats."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrecisionPolicy:
    """Returned by the ``precision_policy`` hook and stored as ``trainer.precision_policy``.

    :param param_dtype: the dtype parameters are stored in (``bfloat16`` for ``bf16-true``).
    :param compute_dtype: the dtype the forward pass computes in (the autocast dtype for a mixed
        precision, else ``param_dtype``). A sharding strategy uses it as its own mixed-precision
        setting, so precision and strategy plugins need not know each other.
    :param reduce_dtype: the dtype gradients are reduced in across processes.
    :param loss_scaling: whether the precision scales the loss (``16-mixed``'s GradScaler). Its
        overflow check sees every gradient only where gradients are not sharded; a sharding
        strategy refuses it at start-up rather than let ranks disagree on skipping a step.
    :param non_finite_hint: a sentence the core adds when the training loss, the parameters
        or the optimizer state become NaN or infinite: a cause this precision is known for, and
        its fix (``16-true``: Adam's default
        ``eps`` underflows in float16). Empty: only the general advice.
    """

    param_dtype: torch.dtype = torch.float32
    compute_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    loss_scaling: bool = False
    non_finite_hint: str = ""

    @property
    def is_mixed(self) -> bool:
        return self.compute_dtype != self.param_dtype
