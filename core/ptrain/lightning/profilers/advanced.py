"""``lightning.pytorch.profilers.advanced``, where Lightning defines ``AdvancedProfiler``:
for programs that import it from there (Lightning's profiler example imports
``PyTorchProfiler`` so). The class is the one of :mod:`ptrain.lightning.profilers`."""

from ptrain.lightning.profilers import AdvancedProfiler

__all__ = ["AdvancedProfiler"]
