"""``lightning.pytorch.callbacks.progress``: ``ProgressBar`` (the base class of progress
displays), ``TQDMProgressBar`` and ``RichProgressBar`` (both ptrain's ``progress-bar``), each
also in the submodule of Lightning's name (``progress_bar``, ``tqdm_progress``,
``rich_progress``)."""

from ptrain.lightning.callbacks.progress.progress_bar import ProgressBar
from ptrain.lightning.callbacks.progress.rich_progress import RichProgressBar
from ptrain.lightning.callbacks.progress.tqdm_progress import TQDMProgressBar

__all__ = ["ProgressBar", "RichProgressBar", "TQDMProgressBar"]
