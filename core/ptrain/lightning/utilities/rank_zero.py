"""Run a function, log or warn on the process of global rank 0 only (Lightning's
``lightning.pytorch.utilities.rank_zero``).

``rank_zero_only.rank`` is always a number, as in Lightning: the value a program (or a launcher)
set on it, else the rank the environment names when it is read (``RANK``, ``LOCAL_RANK``,
``SLURM_PROCID`` or ``JSM_NAMESPACE_RANK``, the first one set), else 0. It is read when a wrapped
function is called, not at import, so a worker whose rank is set after this module was imported
still answers for its own rank.

``rank_zero_info`` and ``rank_zero_debug`` go through the ``logging`` logger of this module, as
Lightning's do; when the program configured no logging, that logger prints INFO and above to
stderr (Lightning's default too).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: where rank_zero_info/rank_zero_debug write
log = logging.getLogger(__name__)
if not logging.root.handlers and not log.handlers:  # the program configured no logging
    log.addHandler(logging.StreamHandler())
    log.setLevel(logging.INFO)
    log.propagate = False
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


class LightningDeprecationWarning(DeprecationWarning):
    """What :func:`rank_zero_deprecation` warns with (shown by default, unlike Python's own
    ``DeprecationWarning`` outside ``__main__``)."""


warnings.simplefilter("default", category=LightningDeprecationWarning)


def _environment_rank() -> int:
    for variable in _RANK_VARIABLES:
        value = os.environ.get(variable)
        if value is not None:
            return int(value)
    return 0


class _RankZeroOnly:
    """The decorator ``rank_zero_only`` (see :meth:`__call__`), carrying ``rank``."""

    def __init__(self) -> None:
        self._rank: int | None = None

    @property
    def rank(self) -> int:
        """The global rank used: the one set here, else the environment's (see the module)."""
        return self._rank if self._rank is not None else _environment_rank()

    @rank.setter
    def rank(self, value: int | None) -> None:
        self._rank = value

    def __call__(self, fn: Callable[..., T], default: T | None = None) -> Callable[..., T | None]:
        """``fn`` wrapped to run on global rank 0 only; elsewhere it returns ``default``."""

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> T | None:
            if self.rank == 0:
                return fn(*args, **kwargs)
            return default

        return wrapped


rank_zero_only = _RankZeroOnly()


def rank_prefixed_message(message: str, rank: int | None) -> str:
    """``message`` with ``[rank: R]`` in front when ``rank`` is given."""
    return message if rank is None else f"[rank: {rank}] {message}"


def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.debug`` on global rank 0."""
    if rank_zero_only.rank == 0:
        log.debug(*args, stacklevel=stacklevel - 2, **kwargs)


def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.info`` on global rank 0."""
    if rank_zero_only.rank == 0:
        log.info(*args, stacklevel=stacklevel - 2, **kwargs)


def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """``warnings.warn`` on global rank 0 (``stacklevel`` counted as Lightning counts it, so the
    warning points at the same caller)."""
    if rank_zero_only.rank == 0:
        warnings.warn(message, stacklevel=stacklevel - 2, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """A :class:`LightningDeprecationWarning` (or ``category=``) on global rank 0."""
    category = kwargs.pop("category", LightningDeprecationWarning)
    rank_zero_warn(message, stacklevel=stacklevel, category=category, **kwargs)


class WarningCache(set):
    """Messages already said: each is warned, deprecated or logged once, on global rank 0."""

    def warn(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_warn(message, stacklevel=stacklevel, **kwargs)

    def deprecation(self, message: str, stacklevel: int = 6, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_deprecation(message, stacklevel=stacklevel, **kwargs)

    def info(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_info(message, stacklevel=stacklevel, **kwargs)
