"""What ``AcceleratorRegistry`` and ``StrategyRegistry`` share: a dict that fills itself from the
installed ptrain plugins the first time it is read (reading the plugin catalog costs a tenth of
a second, so not at import), and keeps what a program registers itself."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ptrain.errors import ConfigError


def installed_plugin(kind: str, name: str) -> Any:
    """The installed ptrain plugin class (or module) of ``kind`` named ``name``, imported; a
    :class:`ptrain.PluginError` when it is not installed or fails to import."""
    from ptrain.catalog import Catalog
    from ptrain.loading import import_target

    return import_target(Catalog.discover().get(kind, name))


def plugin_available(kind: str, name: str) -> bool:
    """Whether ptrain's ``kind`` plugin ``name`` is installed and can run on this machine."""
    from ptrain.errors import PluginError
    from ptrain.loading import check_available

    try:
        return check_available(installed_plugin(kind, name), name) is None
    except PluginError:
        return False


class Registry(dict):
    """Lightning's registry of named classes: ``name -> {"description", "init_params", VALUE:
    class, NAME_KEY: name}``. ``fill()`` supplies the entries of the installed ptrain plugins;
    ``get(name)`` builds the object a name stands for."""

    #: the keys under which an entry holds its class and its name (Lightning's)
    value_key = "class"
    name_key = "name"
    what = "plugin"

    def __init__(self, fill: Callable[[Registry], None]):
        super().__init__()
        self._fill, self._filled = fill, False
        self.user_registered: set[str] = set()

    def _ensure(self) -> None:
        if not self._filled:
            self._filled = True
            self._fill(self)

    def register(self, name: str, value: Callable | None = None, description: str = "",
                 override: bool = False, **init_params: Any) -> Callable:
        """Register ``value`` (a class) under ``name``, with the keyword arguments it is built
        with; without ``value``, a decorator that registers the class it decorates. A name
        already there is a :class:`ptrain.ConfigError` unless ``override=True``."""
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str, found {name}")
        self._ensure()
        if name in self and not override:
            raise ConfigError(f"{self.what} {name!r} is already in the registry; pass "
                              f"override=True to replace it.")

        def do_register(cls: Callable) -> Callable:
            dict.__setitem__(self, name, {"description": description,
                                          "init_params": init_params, self.value_key: cls,
                                          self.name_key: name})
            self.user_registered.add(name)
            return cls

        return do_register(value) if value is not None else do_register

    def get(self, name: str, default: Any = None) -> Any:
        """The object ``name`` stands for, built with its registered arguments; ``default``
        (when given) for a name not registered, else a ``KeyError`` listing the names."""
        self._ensure()
        if name in self:
            entry = dict.__getitem__(self, name)
            return entry[self.value_key](**entry["init_params"])
        if default is not None:
            return default
        raise KeyError(f"{name!r} not found in registry. Available names: "
                       f"{sorted(self.keys())}")

    def remove(self, name: str) -> None:
        self.pop(name)

    def __str__(self) -> str:
        return f"Registered {self.what.capitalize()}s: {', '.join(sorted(self.keys()))}"

    # -- every way of reading it fills it first ------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        self._ensure()
        return dict.__getitem__(self, name)

    def __contains__(self, name: object) -> bool:
        self._ensure()
        return dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        self._ensure()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._ensure()
        return dict.__len__(self)

    def __repr__(self) -> str:
        self._ensure()
        return dict.__repr__(self)

    def __eq__(self, other: object) -> bool:
        self._ensure()
        return dict.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    def keys(self):  # type: ignore[override]
        self._ensure()
        return dict.keys(self)

    def values(self):  # type: ignore[override]
        self._ensure()
        return dict.values(self)

    def items(self):  # type: ignore[override]
        self._ensure()
        return dict.items(self)

    def pop(self, *args: Any) -> Any:
        self._ensure()
        if args:
            self.user_registered.discard(args[0])
        return dict.pop(self, *args)

    def copy(self) -> dict:  # type: ignore[override]
        self._ensure()
        return dict(self.items())
