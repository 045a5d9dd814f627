"""``fp8-mixed``: the Linear layers' matmuls in float8 through torchao's float8 training, the rest
of the model as ``bf16-mixed`` runs it.

On NVIDIA GPUs with float8 tensor cores (compute capability 8.9 and newer: Ada, Hopper,
Blackwell), float8 matmuls run at twice bfloat16's peak. Each converted layer scales its input,
weight and output gradient to float8 on the fly (dynamic scaling: no state to save), and keeps
its float32 weight and gradient. Elsewhere the device is refused with the reason, unless
``--fp8-mixed-emulate`` asks for torchao's emulation (the same arithmetic in high precision,
on any device: how the suite tests it on the CPU).
"""

from ptrain_fp8_precision.plugin import FP8MixedPrecision

__all__ = ["FP8MixedPrecision"]
