"""``grad_norm``: the norm of each parameter's gradient and of all of them together."""

from __future__ import annotations

import torch
from torch import nn


def grad_norm(module: nn.Module, norm_type: float | int | str,
              group_separator: str = "/") -> dict[str, torch.Tensor]:
    """``{"grad_{p}_norm{sep}{name}": norm}`` for each parameter of ``module`` that has a
    gradient, plus ``"grad_{p}_norm_total"``, the norm of all those gradients taken as one vector
    (``p`` is ``norm_type`` as a float; ``"inf"`` for the largest absolute value). Empty when no
    parameter has a gradient. The values are tensors on the gradients' device (log them with
    ``self.log_dict``; nothing here waits for the device). Call it in
    ``on_before_optimizer_step``, where the gradients are final (and unscaled under 16-mixed)."""
    p = float(norm_type)
    if p <= 0:
        raise ValueError(f"`norm_type` must be a positive number or 'inf' (infinity norm). Got "
                         f"{p}")
    norms = {f"grad_{p}_norm{group_separator}{name}": parameter.grad.detach().norm(p)
             for name, parameter in module.named_parameters() if parameter.grad is not None}
    if norms:
        norms[f"grad_{p}_norm_total"] = torch.stack(list(norms.values())).norm(p)
    return norms
