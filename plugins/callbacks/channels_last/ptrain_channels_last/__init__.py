"""The ``channels-last`` callback: the model's 2-D convolution weights and every 4-D floating
batch tensor in the channels-last memory format (NHWC: the channels of a pixel next to each
other), which is what cuDNN's and oneDNN's fastest convolution kernels read, notably on tensor
cores with mixed precision. Without it each such kernel transposes its input and output.

- ``wrap_model`` (a wrapper; before the strategy wraps or shards the model) converts, in place,
  every 4-D parameter and buffer: ``model.to(memory_format=torch.channels_last)``. Values do not
  change, only their layout in memory, so ``state_dict``, checkpoints and resumes are as without
  the plugin (a checkpoint loads into a model in either format).
- ``transfer_batch`` (a wrapper; after the accelerator moved the batch) makes every 4-D floating
  tensor of the batch channels-last, on the device: one copy per such tensor, without a sync.
  Other tensors (labels, masks of other ranks, token ids) pass as they are.
- A model without a 4-D weight is refused at start with the reason: the plugin would change
  nothing (3-D convolutions take ``channels_last_3d``, which this plugin does not set).
"""

from __future__ import annotations

from typing import Any

import torch

from ptrain import ConfigError, hookimpl
from ptrain.data import apply_to_tensors


def _to_channels_last(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 4 and tensor.is_floating_point():
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor


class ChannelsLast:
    """``-p channels-last`` (see the module doc). ``converted`` holds, after setup, the names of
    the 4-D weights it converted."""

    name = "channels-last"

    def __init__(self):
        self.converted: list[str] = []

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        """A layout change: it must train exactly as before. A model without convolutions
        fails its trial, with the reason."""
        if "channels-last" in trainer.plugins:
            return []
        from ptrain.tuning import Candidate

        return [Candidate("channels-last memory format", "memory-format",
                          callbacks=("channels-last",))]

    @hookimpl(wrapper=True)
    def wrap_model(self, trainer, model: torch.nn.Module):
        self.converted = [name for name, p in model.named_parameters() if p.dim() == 4]
        if not self.converted:
            raise ConfigError(
                f"-p channels-last: {type(trainer.module).__qualname__} has no 4-D weight (no "
                f"2-D convolution), so the channels-last format would change nothing. Leave the "
                f"plugin out for this model.")
        model.to(memory_format=torch.channels_last)  # in place, before the strategy wraps it
        return (yield)

    @hookimpl(wrapper=True)
    def transfer_batch(self, batch: Any):
        moved = yield
        return apply_to_tensors(moved, _to_channels_last)


__all__ = ["ChannelsLast"]
