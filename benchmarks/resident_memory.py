"""A benchmark process's resident memory, now and at its peak (Linux's /proc)."""

from __future__ import annotations

import resource


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux's VmHWM). Not getrusage's ru_maxrss: that one
    carries over the peak of the process that started this one (the kernel keeps it across
    exec), so under a large parent it reads the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (not Linux?)")
