"""Time to the first training step: from constructing the trainer to the first ``training_step``.

Each measurement is a fresh process (``python benchmarks/first_step.py --child RUNNER``) that
first imports torch, then the runner's framework (``ptrain.trainer`` for ptrain's rows,
``lightning`` for Lightning's) and ptrain (the benchmark's code uses it), builds
workload (a) of ``overhead.py`` (``Linear(16, 4)``, batch 4) and makes one throwaway optimizer
(torch imports ``torch._dynamo`` when the first optimizer of a process is made, about 1.5 s that
every loop pays alike) -- none of that is timed. The clock then starts, the runner builds its
trainer (the hand-written loop: its optimizer) and fits, and the clock stops when the loss of
the first batch is first asked for. Plugins a trainer imports on the way (ptrain's built-in
callbacks, Lightning's nothing more: ``import lightning`` brought them all) are inside the clock.

The import of the runner's framework is timed too (a column of its own, not in the time to
the first step; nothing for the hand-written loop), so that work moved from the trainer into
the import shows.

Reported per runner: the median and the minimum of ``runs`` processes, run interleaved (one of
each runner in turn, ``runs`` times), so a slow moment of the machine hits every runner alike,
after one unmeasured process of each. The processes may write Python's bytecode caches
(``PYTHONDONTWRITEBYTECODE`` is taken out of their environment), so that a package installed
from the repository in editable mode is not compiled from source in every process while the
installed wheels it is compared with (Lightning's) come compiled: a user's installation has
its caches.
``--pre-intern N`` makes every process intern N new strings before the clock. CPython keeps a
table of interned strings (names in code, attribute and keyword names) and grows it when it
fills: a few milliseconds, once, at a point set by how many names the process has made so far.
Whether that growth falls inside a runner's clock is a matter of where the process stands, not
of the runner's own work; ``--pre-intern 2000`` moves a growth due within the next 2,000 names
before the clock, for every runner alike, so the two tables side by side show how much of each
figure it was.

``overhead.py`` prints this table beside its per-step figures; run alone::

    .venv/bin/python benchmarks/first_step.py            # 5 processes per runner
    .venv/bin/python benchmarks/first_step.py --pre-intern 2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: runner name -> whether it needs Lightning
RUNNERS = {
    "hand-written": False,
    "ptrain (defaults)": False,
    "ptrain (default callbacks off)": False,
    "lightning (all off)": True,
    "lightning (defaults)": True,
}
#: ptrain's default callbacks, blocked for the "off" row
DEFAULT_CALLBACKS_OFF = ["no:checkpoint", "no:tensorboard", "no:progress-bar", "no:results",
                         "no:dataloading", "no:model-summary", "no:stop-signals"]


def child(runner: str, pre_intern: int = 0) -> dict[str, float]:
    """In a fresh process: milliseconds to import the runner's framework (after torch), and
    from building the trainer to the first step (after ``pre_intern`` new interned strings)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    # torch's own first-optimizer import (torch._dynamo, ~1.5 s): before any clock, so that an
    # import of a framework that pulls it in (Lightning's) does not carry it
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    import_start = time.perf_counter()
    if RUNNERS[runner]:
        import lightning  # noqa: F401
    elif runner != "hand-written":
        import ptrain.trainer  # noqa: F401
    imported = time.perf_counter()
    import overhead  # the benchmark's own code (it imports ptrain): not the runner's import

    first: list[float] = []

    def timed_loss(net, batch):
        if not first:
            first.append(time.perf_counter())
        return overhead.mse_loss(net, batch)

    work = replace(overhead.WORKLOADS["a"], loss=timed_loss)
    g = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(work.make_data(4 * 8, g), batch_size=work.batch_size)
    init = work.build().state_dict()
    for i in range(pre_intern):
        sys.intern(f"first-step-pre-intern-{i}")
    prepare = {"hand-written": overhead.prepare_hand,
               "ptrain (defaults)": overhead.ptrain_runner(),
               "ptrain (default callbacks off)":
                   overhead.ptrain_runner(callbacks=DEFAULT_CALLBACKS_OFF),
               "lightning (all off)": overhead.lightning_runner(everything_off=True),
               "lightning (defaults)": overhead.lightning_runner(everything_off=False)}[runner]
    with tempfile.TemporaryDirectory(prefix="ptrain-first-step-") as root, overhead.quiet():
        start = time.perf_counter()
        prepare(work, init, loader, root).run()
    return {"import_ms": (imported - import_start) * 1000, "ms": (first[0] - start) * 1000}


def measure(runs: int, with_lightning: bool,
            pre_intern: int = 0) -> dict[str, list[dict[str, float]]]:
    """runner -> per fresh process, milliseconds to import its framework (``import_ms``) and
    from building its trainer to the first step (``ms``)."""
    chosen = [r for r, needs_lightning in RUNNERS.items() if with_lightning or not needs_lightning]
    times: dict[str, list[dict[str, float]]] = {r: [] for r in chosen}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for repeat in range(-1, runs):  # -1: the unmeasured first process of each runner
        order = chosen[repeat % len(chosen):] + chosen[:repeat % len(chosen)]
        for runner in order:
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                                  runner, "--pre-intern", str(pre_intern)],
                                 capture_output=True, text=True, check=True, cwd=HERE.parent,
                                 env=env)
            if repeat >= 0:
                times[runner].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return times


def first_step_ms(measured: list[dict[str, float]]) -> list[float]:
    """The times to the first step of ``measured`` (one runner's processes)."""
    return [m["ms"] for m in measured]


def table(times: dict[str, list[dict[str, float]]]) -> str:
    rows = ["| runner | time to first step: median (ms) | min (ms) | import after torch: "
            "median (ms) | processes |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for runner, measured in times.items():
        ms = first_step_ms(measured)
        imports = statistics.median(m["import_ms"] for m in measured)
        rows.append(f"| {runner} | {statistics.median(ms):.1f} | {min(ms):.1f} | "
                    f"{imports:.1f} | {len(ms)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", choices=list(RUNNERS), help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per runner")
    parser.add_argument("--no-lightning", action="store_true", help="skip Lightning's rows")
    parser.add_argument("--pre-intern", type=int, default=0, metavar="N",
                        help="intern N new strings in each process before the clock (see above)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.pre_intern)))
        return 0
    from overhead import HAVE_LIGHTNING

    print(table(measure(args.runs, HAVE_LIGHTNING and not args.no_lightning, args.pre_intern)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
