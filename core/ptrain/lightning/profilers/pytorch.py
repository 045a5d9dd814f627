"""``lightning.pytorch.profilers.pytorch``, where Lightning defines ``PyTorchProfiler``:
for programs that import it from there (Lightning's profiler example imports
``PyTorchProfiler`` so). The class is the one of :mod:`ptrain.lightning.profilers`."""

from ptrain.lightning.profilers import PyTorchProfiler

__all__ = ["PyTorchProfiler"]
