"""``measure_flops``: the floating-point operations a model's forward (and backward) runs."""

from __future__ import annotations

from typing import Callable

import torch


def measure_flops(model: torch.nn.Module, forward_fn: Callable[[], torch.Tensor],
                  loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> int:
    """The FLOPs torch's ``FlopCounterMode`` counts while ``forward_fn()`` runs, and with
    ``loss_fn`` also ``loss_fn(output).backward()``. Build the model and its input on the
    ``meta`` device to count without computing (``with torch.device("meta"): ...``).
    ``model`` is not used beyond documenting which model is measured (as in Lightning)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()
    return counter.get_total_flops()
