"""Whether optional packages are installed, as Lightning's examples ask
(``from lightning.pytorch.utilities.imports import _TORCHVISION_AVAILABLE``)."""

from __future__ import annotations

import importlib.util


class _Installed:
    """True when the package ``name`` can be imported (found without importing it); its text
    says so, or how to install it."""

    def __init__(self, name: str, pip_name: str | None = None) -> None:
        self.name, self.pip_name = name, pip_name or name
        self._found: bool | None = None

    def __bool__(self) -> bool:
        if self._found is None:
            try:
                self._found = importlib.util.find_spec(self.name) is not None
            except (ImportError, ValueError):
                self._found = False
        return self._found

    def __str__(self) -> str:
        if self:
            return f"Requirement {self.name!r} met"
        return f"Module not found: {self.name!r}. HINT: Try running `pip install -U " \
               f"{self.pip_name}`"

    def __repr__(self) -> str:
        return str(self)


_OMEGACONF_AVAILABLE = _Installed("omegaconf")
_TORCHVISION_AVAILABLE = _Installed("torchvision")
_RICH_AVAILABLE = _Installed("rich")
