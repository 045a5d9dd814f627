"""``AttributeDict`` (a dict read and written with dots) and ``is_picklable``, as Lightning's
``lightning.pytorch.utilities.parsing`` has them."""

from __future__ import annotations

import pickle
from typing import Any


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``d.lr`` reads ``d["lr"]``, ``d.lr = 0.1`` writes
    it, ``del d.lr`` removes it. Its ``repr`` lists one ``"key": value`` line per key, sorted,
    values aligned (empty text for an empty dict), as Lightning prints hyperparameters."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as missing:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute "
                                 f"'{key}'") from missing

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        del self[key]

    def __repr__(self) -> str:
        if not self:
            return ""
        width = max(len(str(key)) for key in self) + 3
        return "\n".join(f"{chr(34) + str(key) + chr(34) + ':':{width}s} {self[key]}"
                         for key in sorted(self))


def is_picklable(obj: object) -> bool:
    """Whether ``pickle.dumps(obj)`` succeeds (``False`` for the errors an unpicklable object
    raises: a lambda, a lock, an open file...)."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True
