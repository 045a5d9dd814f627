"""``LightningEnum`` (a string enum compared without regard to case) and
``GradClipAlgorithmType``, as in Lightning's ``lightning.pytorch.utilities.enums``."""

from __future__ import annotations

import warnings
from enum import Enum


class LightningEnum(str, Enum):
    """An enum of strings that equals its value in any case (``Mode.FAST == "Fast"``) and hashes
    alike, so members and plain strings mix in sets and dict keys."""

    @classmethod
    def from_str(cls, value: str, source: str = "key") -> LightningEnum:
        """The member whose name (``source="key"``, any case), value (``"value"``, exact) or
        either (``"any"``, names first) is ``value``; a ``ValueError`` listing the valid
        choices otherwise."""
        if source in ("key", "any"):
            for name in cls.__members__:
                if name.lower() == value.lower():
                    return cls[name]
        if source in ("value", "any"):
            for name, member in cls.__members__.items():
                if member == value:
                    return cls[name]
        raise ValueError(f"Invalid match: expected one of {cls._allowed_matches(source)}, but got "
                         f"{value}.")

    @classmethod
    def try_from_str(cls, value: str, source: str = "key") -> LightningEnum | None:
        """:meth:`from_str`, or ``None`` with a warning where nothing matches."""
        try:
            return cls.from_str(value, source)
        except ValueError:
            warnings.warn(UserWarning(f"Invalid string: expected one of "
                                      f"{cls._allowed_matches(source)}, but got {value}."),
                          stacklevel=2)
        return None

    @classmethod
    def _allowed_matches(cls, source: str) -> list[str]:
        names = list(cls.__members__)
        values = [member.value for member in cls.__members__.values()]
        return {"key": names, "value": values}.get(source, names + values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Enum):
            other = other.value
        return self.value.lower() == str(other).lower()

    def __hash__(self) -> int:
        return hash(self.value.lower())


class GradClipAlgorithmType(LightningEnum):
    """``gradient_clip_algorithm``'s values: ``"norm"`` clips the norm of all gradients together,
    ``"value"`` each gradient element."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(val: str) -> bool:
        return any(member.value == val for member in GradClipAlgorithmType)

    @staticmethod
    def supported_types() -> list[str]:
        return [member.value for member in GradClipAlgorithmType]
