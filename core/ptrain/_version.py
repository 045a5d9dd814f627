"""The release version of ptrain-core and of every first-party plugin distribution: the one place
it is written (``scripts/set_version.py`` carries it into every distribution's metadata, and
``tests/test_distributions.py`` checks that they agree)."""

__version__ = "0.1.0"


def compatible_range(version: str) -> str:
    """The requirement range of every release compatible with ``version``: below 1.0 a minor
    release may change the hook contract (``>=0.2,<0.3``), from 1.0 on a major one
    (``>=1.2,<2``). Plugins require ptrain-core in the range of the version they were written
    against."""
    major, minor = (int(part) for part in version.split(".")[:2])
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f">={major}.{minor},<{upper}"
