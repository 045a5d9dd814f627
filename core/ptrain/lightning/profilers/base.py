"""``lightning.pytorch.profilers.base``, where Lightning defines ``PassThroughProfiler``:
for programs that import it from there (Lightning's profiler example imports
``PyTorchProfiler`` so). The class is the one of :mod:`ptrain.lightning.profilers`."""

from ptrain.lightning.profilers import PassThroughProfiler

__all__ = ["PassThroughProfiler"]
