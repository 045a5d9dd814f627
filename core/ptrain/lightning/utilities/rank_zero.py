"""Run a function, print or warn on the process of global rank 0 only.

The rank is read when the function is called: from ``rank_zero_only.rank`` if set, else from the
``RANK`` environment variable that torch's launchers (and ptrain's workers) set, else 0.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _rank() -> int:
    rank = getattr(rank_zero_only, "rank", None)
    if rank is not None:
        return rank
    return int(os.environ.get("RANK", "0"))


def rank_zero_only(function: F) -> F:
    """``function`` wrapped to run only on global rank 0 (elsewhere it returns ``None``)."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if _rank() == 0:
            return function(*args, **kwargs)
        return None

    return wrapped  # type: ignore[return-value]


rank_zero_only.rank = None  # type: ignore[attr-defined]


def rank_zero_info(*args: Any, **kwargs: Any) -> None:
    if _rank() == 0:
        print(*args, **kwargs)


def rank_zero_warn(message: str, *args: Any, **kwargs: Any) -> None:
    if _rank() == 0:
        warnings.warn(message, *args, stacklevel=kwargs.pop("stacklevel", 2), **kwargs)
