"""Campaigns: families of similar cases, of which the default run draws a seeded sample.

Three ways to mark a family, one marker:

- ``@pytest.mark.campaign(sample=K)`` on a parametrized test: its cases are the family (a hostile
  input each, a fault each);
- ``@pytest.mark.campaign(sample=K, family="NAME")``: the tests of every test function marked with
  that name, in any module, form one family (e.g. the programs run under ptrain and Lightning);
- ``@pytest.mark.campaign(sample=K, family="NAME", per="module")``: each module's marked tests
  are one case, drawn or left out together: for modules whose tests check one expensive run
  (a wheelhouse, a whole benchmark), where drawing one test pays for the run anyway.

The README's test command runs K cases of each family. The draw is seeded: by default with a
number taken from the commit under test (so the same commit always draws the same sample, and
every case is drawn over a few commits), or with ``--campaign-seed N``. ``--full`` runs every
case (before a release, or after a change to what a family tests). The run's header says which
it did. What a person names runs whole: with ``-k``, a node id with ``::``, or a test file named
on the command line, the sample never leaves it out.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

MARKER = "campaign"
_PER = ("case", "module")
_KEYWORDS = ("sample", "family", "per")
_SAMPLED = pytest.StashKey[tuple]()  # (families, cases left out, seed, where the seed came from)


def add_options(parser) -> None:
    """The options, added by the conftest's ``pytest_addoption`` (this module is registered as
    a plugin after the options are parsed)."""
    group = parser.getgroup("ptrain campaigns")
    group.addoption("--full", action="store_true",
                    help="run every case of each campaign family (by default: a seeded sample)")
    group.addoption("--campaign-seed", type=int, default=None, metavar="N",
                    help="the seed that draws each campaign family's sample (default: a number "
                         "taken from the commit under test; 0 outside a git checkout)")


def draw(case_ids: list[str], size: int, seed: int, family: str) -> set[str]:
    """``size`` of ``case_ids``, the same for the same seed and family whatever their order."""
    ordered = sorted(case_ids)
    return set(random.Random(f"{seed}:{family}").sample(ordered, min(size, len(ordered))))


def commit_seed(folder: Path) -> tuple[int, str] | None:
    """A seed from the commit checked out in ``folder`` and the commit's short name, or None
    outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = head.stdout.strip()
    if head.returncode != 0 or len(sha) < 8:
        return None
    return int(sha[:6], 16), sha[:9]


def _seed(config) -> tuple[int, str]:
    given = config.getoption("campaign_seed")
    if given is not None:
        return given, "--campaign-seed"
    from_commit = commit_seed(Path(config.rootpath))
    if from_commit is None:
        return 0, "no git checkout"
    seed, short = from_commit
    return seed, f"commit {short}"


def _named_files(config) -> set[Path]:
    """The test files named on the command line (their cases always run)."""
    here = Path(config.invocation_params.dir)
    named = set()
    for arg in config.args:
        path = (here / str(arg).split("::", 1)[0]).resolve()
        if path.is_file():
            named.add(path)
    return named


def _picked_by_hand(config) -> bool:
    return bool(config.option.keyword) or any("::" in str(arg) for arg in config.args)


class _Family:
    """One family's marked tests, grouped into cases."""

    def __init__(self, name: str, sample, per: str, first: str):
        self.name, self.sample, self.per, self.first = name, sample, per, first
        self.cases: dict[str, list] = {}

    def check(self, sample, per: str, where: str) -> None:
        if not isinstance(sample, int) or isinstance(sample, bool) or sample < 1:
            raise pytest.UsageError(
                f"{where}: @pytest.mark.campaign needs sample=K, the number of cases the default "
                f"run draws (an int of at least 1)")
        if per not in _PER:
            raise pytest.UsageError(f"{where}: @pytest.mark.campaign(per={per!r}): choose one "
                                    f"of {', '.join(_PER)}")
        if (sample, per) != (self.sample, self.per):
            raise pytest.UsageError(
                f"{where}: family {self.name!r} is marked sample={sample}, per={per!r} here and "
                f"sample={self.sample}, per={self.per!r} at {self.first}: mark it alike")


def _families(items) -> dict[str, _Family]:
    families: dict[str, _Family] = {}
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        test = item.nodeid.split("[", 1)[0]
        unknown = sorted(set(marker.kwargs) - set(_KEYWORDS))
        if marker.args or unknown:
            given = [repr(a) for a in marker.args] + [f"{k}=" for k in unknown]
            raise pytest.UsageError(f"{test}: @pytest.mark.campaign takes only "
                                    f"{', '.join(k + '=' for k in _KEYWORDS)}; not "
                                    f"{', '.join(given)}")
        name = marker.kwargs.get("family", test)
        sample, per = marker.kwargs.get("sample"), marker.kwargs.get("per", "case")
        family = families.setdefault(name, _Family(name, sample, per, test))
        family.check(sample, per, test)
        case = item.nodeid.split("::", 1)[0] if per == "module" else item.nodeid
        family.cases.setdefault(case, []).append(item)
    return families


def pytest_collection_modifyitems(config, items) -> None:
    if config.getoption("full") or _picked_by_hand(config):
        return
    families = _families(items)
    if not families:
        return
    seed, source = _seed(config)
    named = _named_files(config)
    left_out = []
    for family in families.values():
        kept = draw(list(family.cases), family.sample, seed, family.name)
        left_out += [item for case, case_items in family.cases.items() if case not in kept
                     for item in case_items if Path(item.path).resolve() not in named]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = {id(item) for item in left_out}
        items[:] = [item for item in items if id(item) not in dropped]
    config.stash[_SAMPLED] = (len(families), len(left_out), seed, source)


def pytest_report_collectionfinish(config) -> str | None:
    sampled = config.stash.get(_SAMPLED, None)
    if sampled is None:
        return None
    families, left_out, seed, source = sampled
    if not left_out:  # every case was named on the command line
        return f"campaigns: every case of {families} families runs (the files named run whole)"
    return (f"campaigns: a sample of {families} families (seed {seed}, {source}); {left_out} "
            f"cases left out, run them with --full")


# -- the suite's families that span modules (one place for their sample sizes) ----------------

#: Modules that each check one long run of a whole tool: the wheelhouse installed from nothing,
#: the GPU check's plumbing, the quick fault campaign, a sample of Lightning's own tests, a docs
#: page followed literally. Minutes each; the default run draws one.
WHOLE_TOOL_RUNS = pytest.mark.campaign(family="whole-tool runs", sample=1, per="module")

#: Modules whose tests check jobs of several processes that a module fixture starts together
#: (sharding strategies, launchers, a stopped or killed rank, a full disk, signals, ...): the
#: default run draws three modules, each whole.
JOB_MODULES = pytest.mark.campaign(family="multi-process job modules", sample=3, per="module")

#: Tests that each start one job of two processes (a strategy, a finder or a stage under ddp
#: or fsdp; four for a 2-D mesh): the default run draws eight of them.
TWO_PROCESS_RUNS = pytest.mark.campaign(family="two-process runs", sample=8)
