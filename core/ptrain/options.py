"""Options: what the core and each plugin declare, and how a value from a flag or a config file is
checked and converted.

An option has one name (a Python identifier) that serves three ways:
the keyword argument (``Trainer(max_epochs=3)``, or a plugin class's ``__init__``), the config key
(``max_epochs = 3`` in ``[trainer]`` or in ``[plugins.NAME]``), and the flag (``--max-epochs``, or
``--NAME-key`` for a plugin's option). This module imports neither torch nor any plugin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ptrain.errors import ConfigError

Converter = Callable[[Any], Any]


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def to_int(value: Any) -> int:
    """An integer, from an int or from text such as ``"3"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {_describe(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {_describe(value)}")


def to_float(value: Any) -> float:
    """A number, from an int, a float or text such as ``"0.5"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {_describe(value)}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {_describe(value)}")


def to_int_or_float(value: Any) -> int | float:
    """An int (a count) or a float (a fraction): ``"10"`` is 10 batches, ``"0.25"`` a quarter."""
    if isinstance(value, str) and not any(c in value for c in ".eE"):
        return to_int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return to_float(value)


def to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"expected text, got {_describe(value)}")


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true or false, got {_describe(value)}")


def to_str_list(value: Any) -> list[str]:
    """A list of text: a TOML array, or comma-separated text on the command line."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"expected a list of text, got {_describe(value)}")


CONVERTERS: dict[Any, Converter] = {int: to_int, float: to_float, str: to_str, bool: to_bool}


def _table(owner: str) -> str:
    """The config file's table of ``owner``'s options: ``[trainer]`` or ``[plugins.NAME]``."""
    return "[trainer]" if owner == "trainer" else f"[plugins.{owner}]"


@dataclass(frozen=True)
class Option:
    """One declared option. ``type`` converts a raw value (text from a flag, or a TOML value) or
    raises ``ValueError`` with a message; ``None`` is always accepted for an optional value."""

    name: str
    type: Converter
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None
    required: bool = False
    owner: str = "trainer"  # "trainer" for the core's own options, else the plugin's name
    flag: str = ""

    def convert(self, value: Any, source: str, config_file: str | None = None) -> Any:
        """Return ``value`` converted, or raise :class:`ConfigError` naming ``source`` (where
        the value came from; ``""`` where that is not known here, or for a flag). A value from
        a config file is named by its key, table and ``config_file`` (see :meth:`describe`)."""
        what = self.describe(config_file)
        origin = f" ({source})" if source else ""
        if value is None:
            if self.required:
                given = "" if source in ("default", "") else f" ({source} gave None)"
                raise ConfigError(f"{what} is required and was not given{given}: {self.help}")
            return None
        try:
            converted = self.type(value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid value for {what}{origin}: {exc}.") from None
        if self.choices is not None and converted not in self.choices:
            valid = ", ".join(str(c) for c in self.choices)
            hint = closest(str(converted), [str(c) for c in self.choices])
            raise ConfigError(
                f"invalid value {converted!r} for {what}{origin}; valid choices: "
                f"{valid}.{hint}"
            )
        return converted

    @property
    def table(self) -> str:
        """The option's table in a config file: ``[trainer]`` or ``[plugins.NAME]``."""
        return _table(self.owner)

    def describe(self, config_file: str | None = None) -> str:
        """The option as a message names it, by where its value came from: ``'mode' in
        [plugins.checkpoint] of 'run.toml'`` from config file ``run.toml``; else (a flag, or
        not known) ``--checkpoint-mode (config key 'mode' in [plugins.checkpoint])``."""
        if config_file is not None:
            return f"{self.name!r} in {self.table} of {str(config_file)!r}"
        return f"{self.flag} (config key {self.name!r} in {self.table})"


@dataclass
class OptionGroup:
    """The options of the core or of one plugin, as handed to a plugin's ``add_options`` hook."""

    owner: str
    options: dict[str, Option] = field(default_factory=dict)
    #: key that is not an option here -> how to say it instead (another trainer's spelling)
    instead: dict[str, str] = field(default_factory=dict)

    def add(
        self,
        name: str,
        type: Converter | type = str,
        *,
        default: Any = None,
        help: str = "",
        choices: Iterable[Any] | None = None,
        required: bool = False,
    ) -> None:
        """Declare option ``name`` (a Python identifier) with a converter or one of ``int``,
        ``float``, ``str``, ``bool``. Declaring a name twice is an error."""
        if not name.isidentifier():
            raise ConfigError(f"plugin {self.owner!r} declares option {name!r}, which is not a "
                              f"Python identifier; use letters, digits and underscores.")
        if name in self.options:
            raise ConfigError(f"plugin {self.owner!r} declares option {name!r} twice.")
        converter = CONVERTERS.get(type, type)
        flag_stem = name.replace("_", "-")
        flag = f"--{flag_stem}" if self.owner == "trainer" else f"--{self.owner}-{flag_stem}"
        self.options[name] = Option(
            name=name,
            type=converter,
            default=default,
            help=help,
            choices=tuple(choices) if choices is not None else None,
            required=required,
            owner=self.owner,
            flag=flag,
        )

    def resolve(self, given: dict[str, Any], source: str) -> dict[str, Any]:
        """Defaults overlaid with ``given`` (already-merged config and flags), every value checked.
        Unknown keys are an error naming the closest valid key."""
        self._refuse_unknown(given, "for " + self._where() + (f" ({source})" if source else ""))
        resolved = {}
        for name, opt in self.options.items():
            value = given.get(name, opt.default)
            resolved[name] = opt.convert(value, source if name in given else "default")
        return resolved

    def check_config_file(self, given: dict[str, Any], path: str | None) -> None:
        """Check the values this group's table of config file ``path`` gives (not the defaults,
        nor whether a required option is given: a flag may give it): an unknown key or a bad
        value is named by its key, its table and the file, not as a flag the user never gave."""
        self._refuse_unknown(given, f"in {_table(self.owner)} of {str(path)!r}")
        for key, value in given.items():
            if key in self.options:
                self.options[key].convert(value, "", str(path))

    def _refuse_unknown(self, given: dict[str, Any], where: str) -> None:
        """Refuse the first key of ``given`` that is no option of this group, saying ``where``
        it was given (``for [trainer] (Trainer(...))``, ``in [trainer] of 'run.toml'``)."""
        for key in given:
            if key not in self.options:
                if key in self.instead:
                    raise ConfigError(f"unknown option {key!r} {where}: {self.instead[key]}")
                raise ConfigError(
                    f"unknown option {key!r} {where}; valid keys: "
                    f"{', '.join(sorted(self.options)) or '(none)'}."
                    f"{closest(key, list(self.options))}"
                )

    def _where(self) -> str:
        return "[trainer]" if self.owner == "trainer" else f"plugin {self.owner!r}"


def closest(word: str, choices: Iterable[str]) -> str:
    """A sentence naming what of ``choices`` ``word`` was likely meant to be (see
    :func:`near_names`), or an empty string."""
    near = near_names(word, choices)
    if len(near) > 1:
        return f" Did you mean one of {', '.join(map(repr, near))}?"
    return f" Did you mean {near[0]!r}?" if near else ""


def near_names(word: str, choices: Iterable[str]) -> list[str]:
    """The one of ``choices`` closest to ``word`` when it is close enough to be a slip of the
    keyboard (a few letters typed, dropped, swapped or wrong: at most one per three letters of
    ``word``, between 1 and 3 in all); else those that begin with ``word`` (``bf16``); else
    none: ``cuda`` is not a near miss for ``cpu``."""
    choices = list(choices)
    allowed = max(1, min(3, len(word) // 3))
    near = [(edit_distance(word, choice), choice) for choice in choices]
    near = [(distance, choice) for distance, choice in near if distance <= allowed]
    if near:
        return [min(near)[1]]
    return sorted(c for c in choices if len(word) >= 2 and c.startswith(word))


def edit_distance(a: str, b: str) -> int:
    """The fewest single-letter insertions, deletions, substitutions and swaps of two neighbours
    that turn ``a`` into ``b`` (optimal string alignment distance)."""
    before, row = None, list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (x != y))
            if before is not None and i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                current[j] = min(current[j], before[j - 2] + 1)
        before, row = row, current
    return row[-1]


