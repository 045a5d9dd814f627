"""What ``ptrain tune`` may change: the candidates the installed plugins offer, and the run
configurations they make.

A plugin offers candidates through its ``tune_candidates`` hook (called on the class, like
``add_options``); the core offers none of its own beyond those of its built-in plugins. A
candidate is a change to the run's configuration -- Trainer options, callbacks added, plugin
options -- that ``ptrain fit`` understands, so that the winning combination can be written as a
config file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: how a candidate is judged on its losses (see :class:`Candidate`)
NUMERICS = ("same", "changed")


@dataclass(frozen=True)
class Candidate:
    """One setting a plugin can change, as ``ptrain tune`` measures it.

    ``name`` is how the table shows it (``"precision bf16-mixed"``); ``setting`` is what it
    changes (``"precision"``): a combination holds at most one candidate per setting, and
    ``--tune-only``/``--tune-skip`` select by it. ``trainer`` holds the Trainer options it sets,
    ``callbacks`` the callbacks it adds (by name), ``plugin_options`` the options it gives
    plugins (``{"compile": {"mode": "default"}}``). ``numerics`` is ``"same"`` when the change
    must train exactly as before (workers, pinning, compile: the losses must match the
    baseline's within float tolerance, or it is flagged), ``"changed"`` when it may change the
    numbers (a precision, a batch size: judged on its loss against the baseline's).
    ``unavailable`` says why it can't run here (it is listed, not measured)."""

    name: str
    setting: str
    trainer: Mapping[str, Any] = field(default_factory=dict)
    callbacks: tuple[str, ...] = ()
    plugin_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    numerics: str = "same"
    unavailable: str | None = None

    def __post_init__(self) -> None:
        if self.numerics not in NUMERICS:
            raise ValueError(f"candidate {self.name!r}: numerics must be one of {NUMERICS}, "
                             f"not {self.numerics!r}")
        if not (self.trainer or self.callbacks or self.plugin_options):
            raise ValueError(f"candidate {self.name!r} changes nothing: give trainer options, "
                             f"callbacks or plugin options")
        object.__setattr__(self, "callbacks", tuple(self.callbacks))


@dataclass(frozen=True)
class RunConfig:
    """A run's configuration as the Trainer takes it: its options (``callbacks`` among them)
    and its plugins' options."""

    trainer: Mapping[str, Any]
    plugin_options: Mapping[str, Mapping[str, Any]]

    def with_candidates(self, candidates: tuple[Candidate, ...]) -> RunConfig:
        """This configuration with ``candidates`` applied, in order."""
        trainer = dict(self.trainer)
        plugins = {name: dict(values) for name, values in self.plugin_options.items()}
        for candidate in candidates:
            trainer.update(candidate.trainer)
            callbacks = list(trainer.get("callbacks") or [])
            for name in candidate.callbacks:  # added, and no longer blocked
                callbacks = [c for c in callbacks if c != f"no:{name}"]
                if name not in callbacks:
                    callbacks.append(name)
            trainer["callbacks"] = callbacks
            for plugin, values in candidate.plugin_options.items():
                plugins.setdefault(plugin, {}).update(values)
        return RunConfig(trainer, plugins)


def precision_candidate(trainer: Any, name: str) -> list[Candidate]:
    """What a precision plugin named ``name`` offers: itself, unless it is the run's already
    (judged on its loss: a precision changes the numbers)."""
    if name in (trainer.options.get("precision"), getattr(trainer, "precision", None)):
        return []
    return [Candidate(f"precision {name}", "precision", trainer={"precision": name},
                      numerics="changed")]


def changes_nothing(base: RunConfig, candidate: Candidate) -> bool:
    """Whether ``candidate`` leaves ``base`` as it is (it is already the user's setting)."""
    changed = base.with_candidates((candidate,))
    return (dict(changed.trainer) == {**base.trainer, "callbacks": list(
        base.trainer.get("callbacks") or [])}
            and {k: dict(v) for k, v in changed.plugin_options.items()}
            == {k: dict(v) for k, v in base.plugin_options.items()})


def selected_settings(candidates: list[Candidate], only: list[str] | None,
                      skip: list[str] | None) -> list[Candidate]:
    """The candidates whose setting ``only`` names (all when ``None``) and ``skip`` does not;
    a name that is no candidate's setting is a :class:`ptrain.ConfigError` naming them."""
    from ptrain.errors import ConfigError

    known = sorted({c.setting for c in candidates})
    for flag, names in (("--tune-only", only), ("--tune-skip", skip)):
        unknown = [n for n in names or [] if n not in known]
        if unknown:
            from ptrain.options import closest

            raise ConfigError(
                f"{flag}: {', '.join(map(repr, unknown))} is not a setting the installed "
                f"plugins offer to tune.{closest(unknown[0], known)} The settings: "
                f"{', '.join(known) or 'none'}. A setting comes from a plugin's tune_candidates "
                f"hook; install the plugin that offers it.")
    return [c for c in candidates
            if (only is None or c.setting in only) and c.setting not in (skip or [])]


__all__ = ["Candidate", "NUMERICS", "RunConfig", "changes_nothing", "precision_candidate",
           "selected_settings"]
