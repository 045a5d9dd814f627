"""``lightning.pytorch.profilers.simple``, where Lightning defines ``SimpleProfiler``:
for programs that import it from there (Lightning's profiler example imports
``PyTorchProfiler`` so). The class is the one of :mod:`ptrain.lightning.profilers`."""

from ptrain.lightning.profilers import SimpleProfiler

__all__ = ["SimpleProfiler"]
