"""Where the suite's time goes, per file: a table at the end of every run.

``--durations`` names the slowest tests; most of the suite's time is spread over many tests of a
few seconds each, which only a per-file total shows. CI logs keep the table, to decide which
families of cases the default run samples (issue 34).
"""

from __future__ import annotations

from collections import defaultdict

#: file -> [seconds of setup, call and teardown, number of tests]
_per_file: dict[str, list] = defaultdict(lambda: [0.0, 0])

SHOWN = 30


def pytest_runtest_logreport(report) -> None:
    entry = _per_file[report.nodeid.split("::", 1)[0]]
    entry[0] += report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        entry[1] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    if not _per_file:
        return
    total = sum(seconds for seconds, _ in _per_file.values())
    terminalreporter.section(f"time per file, slowest first ({len(_per_file)} files)")
    ranked = sorted(_per_file.items(), key=lambda item: -item[1][0])
    for path, (seconds, tests) in ranked[:SHOWN]:
        terminalreporter.write_line(
            f"{seconds:8.1f}s {100 * seconds / max(total, 1e-9):5.1f}% {tests:4d} tests  {path}")
    terminalreporter.write_line(f"{total:8.1f}s in all")
