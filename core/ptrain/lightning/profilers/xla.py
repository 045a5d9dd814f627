"""``lightning.pytorch.profilers.xla``, where Lightning defines ``XLAProfiler``:
for programs that import it from there (Lightning's profiler example imports
``PyTorchProfiler`` so). The class is the one of :mod:`ptrain.lightning.profilers`."""

from ptrain.lightning.profilers import XLAProfiler

__all__ = ["XLAProfiler"]
