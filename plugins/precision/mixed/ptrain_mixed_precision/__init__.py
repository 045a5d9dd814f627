"""Mixed precision: float32 weights, the forward pass and the loss under ``torch.autocast``.

``bf16-mixed`` autocasts to bfloat16 on the CPU and on CUDA. The backward pass and the optimizer
step run outside autocast, on the float32 weights. bfloat16 has float32's range, so there is no
loss scaling. (``16-mixed``, with a gradient scaler, is still to come.)
"""

from __future__ import annotations

import torch

from ptrain import PluginError, PrecisionPolicy, hookimpl


class BF16MixedPrecision:
    dtype = torch.bfloat16

    @hookimpl
    def precision_policy(self) -> PrecisionPolicy:
        return PrecisionPolicy(param_dtype=torch.float32, compute_dtype=self.dtype,
                               reduce_dtype=torch.float32)

    @hookimpl(wrapper=True)
    def setup_device(self):
        device = yield
        if not torch.amp.is_autocast_available(device.type):
            raise PluginError(f"bf16-mixed needs torch.autocast on the {device.type!r} device, "
                              f"which this torch does not offer; use --precision bf16-true or "
                              f"32-true there.")
        return device

    @hookimpl(wrapper=True)
    def model_step(self, trainer):
        # forward and loss only: backward and the optimizer step run after this returns
        with torch.autocast(device_type=trainer.device.type, dtype=self.dtype):
            return (yield)
