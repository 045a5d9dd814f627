"""``lightning.pytorch.callbacks.progress.tqdm_progress``: ``TQDMProgressBar`` (drawn by ptrain's
``progress-bar``) and ``Tqdm``, Lightning's tqdm bar class, which a program's own display may
draw with (it needs the ``tqdm`` package)."""

from __future__ import annotations

import functools
from typing import Any

from ptrain.lightning._common import refuse
from ptrain.lightning.callbacks.progress.progress_bar import _PtrainBar

#: the width a float or a number given as text is padded to with zeros, so that a changing
#: value does not make the line jump
_NUMBER_WIDTH = 5

#: the bar's line as Lightning's: done/total (``?`` when unknown), times, the rate in batches
#: per second (never inverted) and the metrics
_BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"


class TQDMProgressBar(_PtrainBar):
    """Lightning's ``TQDMProgressBar``, drawn by ptrain's ``progress-bar`` (see
    :class:`_PtrainBar`). ``refresh_rate=0`` turns it off; another value leaves the redrawing
    to ptrain's bar (at most every 0.2 s). ``leave`` is accepted either way: ptrain prints one
    line per finished epoch. ``process_position`` other than 0 is refused.

    The ``init_*_tqdm`` methods are there for a subclass to call (NeuralProphet's bar makes its
    own in ``__init__`` and moves it in its callback methods): each returns a new
    :class:`Tqdm` with that stage's description, disabled when this bar is, which the caller
    draws; ptrain never calls them and draws its own display besides. A subclass overriding
    one is refused when made, since ptrain would not call its override."""

    _drawing = ("init_sanity_tqdm", "init_train_tqdm", "init_predict_tqdm",
                "init_validation_tqdm", "init_test_tqdm")

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        if process_position != 0:
            raise refuse("TQDMProgressBar", "process_position", process_position,
                         "ptrain draws one progress display; leave process_position at 0")
        super().__init__(refresh_rate)
        self.leave = leave
        self.process_position = process_position

    def _tqdm(self, description: str, leave: bool, **options: Any) -> Any:
        """A :class:`Tqdm` for the caller to draw, on stdout, with Lightning's settings."""
        import sys

        return _tqdm_class()(desc=description, position=0, disable=self.is_disabled,
                             leave=leave, dynamic_ncols=True, file=sys.stdout,
                             bar_format=_BAR_FORMAT, **options)

    def init_sanity_tqdm(self) -> Any:
        return self._tqdm(self.sanity_check_description, leave=False)

    def init_train_tqdm(self) -> Any:
        return self._tqdm(self.train_description, leave=True, smoothing=0)

    def init_predict_tqdm(self) -> Any:
        return self._tqdm(self.predict_description, leave=True, smoothing=0)

    def init_validation_tqdm(self) -> Any:
        return self._tqdm(self.validation_description, leave=False)

    def init_test_tqdm(self) -> Any:
        return self._tqdm(self.test_description, leave=True)


_LAZY = ("Tqdm",)  # made when first asked for: it needs tqdm


def __getattr__(name: str) -> Any:
    if name == "Tqdm":
        return _tqdm_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _tqdm_class() -> type:
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise ImportError(f"{__name__}.Tqdm is a tqdm bar, and tqdm is not installed: pip "
                          f"install tqdm") from exc

    class Tqdm(tqdm):
        """tqdm's bar, showing floats (and numbers given as text) padded with zeros to
        five characters, as Lightning's ``Tqdm`` does."""

        @staticmethod
        def format_num(n: int | float | str) -> str:
            text = n if isinstance(n, str) else tqdm.format_num(n)
            if not isinstance(n, (float, str)) or "e" in text:
                return text
            if "." not in text:
                if len(text) >= _NUMBER_WIDTH:
                    return text
                try:
                    float(text)
                except ValueError:
                    return text
                text += "."
            return text.ljust(_NUMBER_WIDTH, "0")

    Tqdm.__module__ = __name__
    return Tqdm


__all__ = ["TQDMProgressBar", *_LAZY]
