"""``lightning.pytorch.profilers.profiler``, where Lightning defines ``Profiler``:
for programs that import it from there (Lightning's profiler example imports
``PyTorchProfiler`` so). The class is the one of :mod:`ptrain.lightning.profilers`."""

from ptrain.lightning.profilers import Profiler

__all__ = ["Profiler"]
