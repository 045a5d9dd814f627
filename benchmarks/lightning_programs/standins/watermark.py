"""Stand-in for the ``watermark`` package, which programs call only to print the versions they
ran with: returns the versions of the packages named, one ``name: version`` a line."""

from importlib import metadata


def watermark(packages: str = "", **_ignored) -> str:
    lines = []
    for name in filter(None, (p.strip() for p in packages.split(","))):
        try:
            lines.append(f"{name}: {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{name}: not installed")
    return "\n".join(lines)
