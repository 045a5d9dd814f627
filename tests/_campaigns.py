"""Campaigns: families of many similar cases, of which the default run draws a seeded sample.

A test marked ``@pytest.mark.campaign(sample=K)`` is a family (its parametrized cases): a hostile
input each, a fault each. The README's test command runs K of its cases, drawn from the family's
node ids with ``--campaign-seed`` (0 unless given), the same K on every run with the same seed;
``--full`` runs every case (before a release, or after a change to what the family tests). The
run's header says which it did. A family named on the command line (``-k``, or a node id with
``::``) runs whole: the sample is for the broad run, never for a person picking tests.
"""

from __future__ import annotations

import random

import pytest

MARKER = "campaign"
_SAMPLED = pytest.StashKey[tuple]()  # (families, cases left out, seed)


def add_options(parser) -> None:
    """The options, added by the conftest's ``pytest_addoption`` (this module is registered as
    a plugin after the options are parsed)."""
    group = parser.getgroup("ptrain campaigns")
    group.addoption("--full", action="store_true",
                    help="run every case of each campaign family (by default: a seeded sample)")
    group.addoption("--campaign-seed", type=int, default=0, metavar="N",
                    help="the seed that draws each campaign family's sample (default: 0)")


def _family(item) -> str:
    """The test function an item is a case of: its node id without the parameters."""
    return item.nodeid.split("[", 1)[0]


def _picked_by_hand(config) -> bool:
    return bool(config.option.keyword) or any("::" in str(arg) for arg in config.args)


def draw(case_ids: list[str], size: int, seed: int, family: str) -> set[str]:
    """``size`` of ``case_ids``, the same for the same seed and family whatever their order."""
    ordered = sorted(case_ids)
    return set(random.Random(f"{seed}:{family}").sample(ordered, min(size, len(ordered))))


def pytest_collection_modifyitems(config, items) -> None:
    if config.getoption("full") or _picked_by_hand(config):
        return
    families: dict[str, list] = {}
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None:
            families.setdefault(_family(item), []).append((item, marker))
    if not families:
        return
    seed = config.getoption("campaign_seed")
    left_out = []
    for family, cases in families.items():
        size = cases[0][1].kwargs.get("sample")
        if not isinstance(size, int) or size < 1:
            raise pytest.UsageError(f"{family}: @pytest.mark.campaign needs sample=K, the number "
                                    f"of cases the default run draws (an int of at least 1)")
        kept = draw([item.nodeid for item, _ in cases], size, seed, family)
        left_out += [item for item, _ in cases if item.nodeid not in kept]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = {id(item) for item in left_out}
        items[:] = [item for item in items if id(item) not in dropped]
    config.stash[_SAMPLED] = (len(families), len(left_out), seed)



def pytest_report_collectionfinish(config) -> str | None:
    sampled = config.stash.get(_SAMPLED, None)
    if sampled is None:
        return None
    families, left_out, seed = sampled
    return (f"campaigns: a sample of {families} families (seed {seed}); {left_out} cases left "
            f"out, run them with --full")
