"""``lightning.pytorch.callbacks.progress.rich_progress``: ``RichProgressBar``, drawn by ptrain's
``progress-bar``."""

from __future__ import annotations

from typing import Any

from ptrain.lightning._common import refuse
from ptrain.lightning.callbacks.progress.progress_bar import _PtrainBar


class RichProgressBar(_PtrainBar):
    """Lightning's ``RichProgressBar``, drawn by ptrain's ``progress-bar``, itself made with
    rich (see :class:`_PtrainBar`). ``refresh_rate=0`` turns it off; ``leave`` is accepted
    (ptrain prints one line per finished epoch); a ``theme`` or ``console_kwargs`` is refused:
    ptrain's bar has its own columns and console."""

    _drawing = ("configure_columns",)

    def __init__(self, refresh_rate: int = 1, leave: bool = False, theme: Any = None,
                 console_kwargs: dict[str, Any] | None = None):
        if theme is not None and not _is_default_theme(theme):
            raise refuse("RichProgressBar", "theme", theme,
                         "ptrain's bar has its own colours; leave theme out")
        if console_kwargs is not None:
            raise refuse("RichProgressBar", "console_kwargs", console_kwargs,
                          "ptrain's bar writes to the terminal's console; leave them out")
        super().__init__(refresh_rate)
        self.leave = leave


def _is_default_theme(theme: Any) -> bool:
    return type(theme).__name__ == "RichProgressBarTheme" and theme == type(theme)()


__all__ = ["RichProgressBar"]
