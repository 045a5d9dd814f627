"""The catalog of installed plugins, read from entry-point metadata only.

Nothing here imports a plugin or torch: listing plugins must stay fast and must survive any plugin
being broken. Importing happens in :mod:`ptrain.loading`, and only for the plugins a run selects.
"""

from __future__ import annotations

from dataclasses import dataclass

from ptrain._version import __version__
from ptrain.errors import PluginError
from ptrain.options import closest, near_names

#: plugin kind -> entry-point group. One accelerator, one strategy and one precision are active at
#: a time; callbacks are any number.
GROUPS: dict[str, str] = {
    "accelerator": "ptrain.accelerators",
    "strategy": "ptrain.strategies",
    "precision": "ptrain.precision",
    "callback": "ptrain.callbacks",
}
EXCLUSIVE_KINDS = ("accelerator", "strategy", "precision")
CORE_DISTRIBUTION = "ptrain-core"

#: every first-party plugin by kind and name, with the distribution that provides it: a name
#: asked for but not installed is then a distribution to install, not an unknown word (kept
#: equal to the entry points of the repository's distributions by tests/test_distributions.py)
FIRST_PARTY: dict[str, dict[str, str]] = {
    "accelerator": {"cuda": "ptrain-cuda", "hpu": "ptrain-habana", "mps": "ptrain-mps",
                    "tpu": "ptrain-xla"},
    "strategy": {"ddp": "ptrain-ddp", "fsdp": "ptrain-fsdp",
                 "model-parallel": "ptrain-model-parallel", "xla": "ptrain-xla",
                 "zero1": "ptrain-zero", "zero2": "ptrain-zero", "zero3": "ptrain-zero"},
    "precision": {"16-mixed": "ptrain-mixed-precision", "bf16-mixed": "ptrain-mixed-precision",
                  "16-true": "ptrain-true-precision", "bf16-true": "ptrain-true-precision",
                  "64-true": "ptrain-true-precision", "fp8-mixed": "ptrain-fp8-precision"},
    "callback": {"activation-checkpointing": "ptrain-activation-checkpointing",
                 "batch-size-finder": "ptrain-finders", "channels-last": "ptrain-channels-last",
                 "compile": "ptrain-compile",
                 "early-stopping": "ptrain-early-stopping",
                 "fused-optimizer": "ptrain-fused-optimizer",
                 "learning-rate-monitor": "ptrain-lr-monitor", "lr-finder": "ptrain-finders",
                 "mlflow": "ptrain-mlflow", "profiler": "ptrain-profiler",
                 "toggling": "ptrain-toggling", "wandb": "ptrain-wandb"},
}


@dataclass(frozen=True)
class PluginInfo:
    """One entry point: what a user types (``name``), what it refers to and who ships it."""

    kind: str
    name: str
    target: str  # "module" or "module:attribute"
    distribution: str
    version: str

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name!r} ({self.distribution} {self.version})"


class Catalog:
    """Every installed plugin by kind and name; duplicates are kept so they can be reported."""

    def __init__(self, infos: list[PluginInfo]):
        self.infos = sorted(infos, key=lambda i: (list(GROUPS).index(i.kind), i.name))

    @classmethod
    def discover(cls) -> Catalog:
        """Every plugin installed in this environment (see :mod:`ptrain.entry_point_cache`)."""
        from ptrain.entry_point_cache import entry_points

        kinds = {group: kind for kind, group in GROUPS.items()}
        infos: dict[tuple[str, str, str], PluginInfo] = {}
        for group, name, value, dist_name, version in entry_points(list(GROUPS.values())):
            # The same distribution can be seen twice when it is on sys.path twice.
            infos[(kinds[group], name, dist_name)] = PluginInfo(kinds[group], name, value,
                                                                dist_name, version)
        return cls(list(infos.values()))

    def names(self, kind: str) -> list[str]:
        return sorted({i.name for i in self.infos if i.kind == kind})

    def claims(self, kind: str, name: str) -> list[PluginInfo]:
        return [i for i in self.infos if i.kind == kind and i.name == name]

    def get(self, kind: str, name: str) -> PluginInfo:
        """The one plugin of ``kind`` called ``name``, or a :class:`PluginError` that lists the
        installed names (with the closest one) or names both distributions of a clash."""
        claims = self.claims(kind, name)
        if len(claims) == 1:
            return claims[0]
        if not claims:
            installed = self.names(kind)
            elsewhere = [i for i in self.infos if i.name == name]
            if elsewhere:
                other = elsewhere[0].kind
                how = f"-p {name}" if other == "callback" else f"--{other} {name}"
                raise PluginError(
                    f"{name!r} is a {other} plugin, not a {kind}; select it with {how}. "
                    f"Installed {kind} plugins: {', '.join(installed) or '(none)'}."
                )
            if name in FIRST_PARTY[kind]:
                dist = FIRST_PARTY[kind][name]
                raise PluginError(
                    f"the {kind} {name!r} comes with the distribution {dist}, which is not "
                    f"installed here: pip install {dist} (or pip install \"ptrain-core[all]\" "
                    f"for every first-party plugin). Installed {kind} plugins: "
                    f"{', '.join(installed) or '(none)'}.")
            suggestion = closest(name, installed)
            uninstalled = {n: d for n, d in FIRST_PARTY[kind].items() if n not in installed}
            meant = near_names(name, uninstalled)
            if not suggestion and len(meant) == 1:
                suggestion = (f" Did you mean {meant[0]!r}? It comes with "
                              f"{uninstalled[meant[0]]}, which is not installed here: pip "
                              f"install {uninstalled[meant[0]]}.")
            raise PluginError(
                f"unknown {kind} {name!r}. Installed {kind} plugins: "
                f"{', '.join(installed) or '(none)'}.{suggestion} "
                f"Run `ptrain plugins` to see every installed plugin; a new one is installed with "
                f"pip (its distribution registers the entry-point group {GROUPS[kind]!r})."
            )
        who = " and ".join(f"{c.distribution} {c.version} ({c.target})" for c in claims)
        raise PluginError(
            f"two distributions claim the {kind} name {name!r}: {who}. Uninstall one of them "
            f"(pip uninstall NAME) so that the name is unambiguous."
        )

    def distributions(self) -> dict[str, str]:
        """Every distribution that provides a plugin (the core included), with its version."""
        dists = {i.distribution: i.version for i in self.infos}
        dists.setdefault(CORE_DISTRIBUTION, __version__)
        return dict(sorted(dists.items()))

    def owner_of_flag(self, flag: str) -> PluginInfo | None:
        """The installed plugin whose option namespace ``flag`` falls in (``--NAME-...``, or
        ``--no-NAME-...`` for a boolean option turned off)."""
        for info in sorted(self.infos, key=lambda i: -len(i.name)):
            if flag.startswith((f"--{info.name}-", f"--no-{info.name}-")):
                return info
        return None

