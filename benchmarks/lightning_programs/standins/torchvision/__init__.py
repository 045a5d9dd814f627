"""A small stand-in for torchvision, for catalogued programs that use only its MNIST data set and
basic transforms, in an environment without a torchvision build (torch 2.13's CPU venv).

It reads the files ``data.py`` makes (torchvision's on-disk MNIST format) and never downloads.
Only the program's own files may import it (those under ``LP_STANDIN_ROOT``, the run folder the
harness sets): to libraries that probe for torchvision (torchmetrics, Lightning, ptrain) it is an
ImportError, as a missing torchvision is, so they don't reach for the parts it lacks.
"""

import os
import sys


def _importer() -> str:
    """The file of the first frame outside the import machinery that imports this package."""
    frame = sys._getframe(2)  # past this function and the package's own module code
    while frame is not None and "importlib" in frame.f_code.co_filename:
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


_ROOT = os.environ.get("LP_STANDIN_ROOT")
if not _ROOT or not os.path.abspath(_importer()).startswith(os.path.abspath(_ROOT)):
    raise ImportError("the torchvision stand-in is for the program's own files only")

from . import datasets, transforms  # noqa: E402

__version__ = "0.0-standin"
__all__ = ["datasets", "transforms"]
