"""CLI fuzzing (issue 16): ``ptrain fit`` with random combinations of flags and values, each of
which must end in success or in a one-paragraph usage error (exit 2), never a traceback.

    python tests/_fuzz_cli.py --runs 300 --seed 0 --json OUT.json

Every flag of ``ptrain fit`` is a candidate: the core's and those of every installed plugin (read
from their declared options, so a new option is fuzzed without a change here), and ``-p NAME`` /
``-p no:NAME`` for each callback. A run appends 1 to 3 of them to a small base run (a 16-sample
model, 2 steps), a plugin's option mostly with the flag that makes the plugin part of the run,
each with its default or one of its choices about half the time, else a value from a pool of
plain, edge and hostile values (0, -1, NaN, inf, 1e309, empty, unicode, a near miss of a
choice).

The runs go through ``ptrain.cli.main`` in this one process (a fresh interpreter per run would
take an hour), with stderr captured; a run still going after ``--run-timeout`` seconds is a hang.
Multi-process runs are kept out (``--devices`` is drawn from values that give one process, and
``--num-nodes`` from those a single machine refuses), since a stage called from this script
would start this script again as the other ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import signal
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


#: values every option may get
POOL = ["0", "1", "2", "3", "-1", "-2", "0.5", "1.5", "-0.5", "2.0", "1e309", "nan", "inf",
        "-inf", "", " ", "abc", "true", "false", "yes", "auto", "none", "None", "null", "[1, 2]",
        "1,2", "00:00:00:01", "1:2", "99999999999999999999", "ü", "--", "0x10", "1_000",
        "/nonexistent/path", "{epoch}", "3.0e-3", "1000"]
#: options whose values would start more processes or run long: drawn from these only
CONFINED = {
    "devices": ["1", "0", "-1", "abc", "1.5", "", "[0]", "0,", "[]", "99"],
    "num_nodes": ["1", "0", "-1", "abc", "1.5", ""],
    "max_epochs": ["1", "0", "-1", "-2", "2", "abc", "1.5", ""],
    "max_steps": ["1", "0", "-1", "3", "abc", "1.5", "nan", ""],
    "min_epochs": ["1", "0", "-1", "3", "abc", ""],
    "min_steps": ["1", "0", "-1", "5", "abc", ""],
    "default_root_dir": None,  # the run's own folder
}
#: the time one run may take before it counts as a hang
RUN_TIMEOUT = 60


#: the flag that makes a plugin of each kind part of a run
_ACTIVATE = {"callback": "-p", "strategy": "--strategy", "accelerator": "--accelerator",
             "precision": "--precision"}


def candidates() -> list[dict]:
    """Every option of ``fit``: its flag, the values to draw (``None``: the pool), whether it is
    a boolean flag, its default, and the flags that make its plugin part of the run."""
    from ptrain.catalog import Catalog
    from ptrain.config import core_options
    from ptrain.loading import declare_options, import_target

    groups = [(core_options(), [])]
    callbacks = []
    for info in Catalog.discover().infos:
        if info.kind == "callback":
            callbacks.append(info.name)
        groups.append((declare_options(import_target(info), info.name),
                       [_ACTIVATE[info.kind], info.name]))
    found = []
    for group, activation in groups:
        for opt in group.options.values():
            if opt.owner == "trainer" and opt.name == "callbacks":
                continue
            confined = CONFINED.get(opt.name, False) if opt.owner == "trainer" else False
            if confined is None:
                continue
            values = list(confined) if confined else None
            if values is None and opt.choices:
                values = [str(c) for c in opt.choices] + [f"{opt.choices[0]}x"] + POOL[:6]
            found.append({"flag": opt.flag, "values": values,
                          "boolean": opt.type.__name__ == "to_bool",
                          "default": None if opt.default in (None, []) else str(opt.default),
                          "activation": activation})
    for name in callbacks:
        found.append({"flag": "-p", "values": [name, f"no:{name}", f"{name}x", "no:", ""],
                      "boolean": False, "default": None, "activation": []})
    return found


def draw(rng: random.Random, options: list[dict]) -> list[str]:
    """1 to 3 options, each mostly with its plugin made part of the run, and a value that is its
    default or one of its choices about half the time, else from the pool."""
    argv: list[str] = []
    for option in rng.sample(options, rng.randint(1, 3)):
        if option["activation"] and rng.random() < 0.85:
            argv += option["activation"]
        flag = option["flag"]
        if option["boolean"] and rng.random() < 0.7:
            argv.append(flag if rng.random() < 0.5 else flag.replace("--", "--no-", 1))
            continue
        values = option["values"]
        if values is None:
            plain = [option["default"]] if option["default"] is not None else []
            values = plain if plain and rng.random() < 0.4 else POOL
        argv += [flag, rng.choice(values)]
    return argv


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run_one(argv: list[str]) -> dict:
    """Run ``ptrain`` with ``argv`` here; what it gave: ``ok`` (exit 0), ``usage`` (exit 2 with
    one ``ptrain: error:`` paragraph), or a failure kind with its detail."""
    from ptrain.cli import main

    err = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(RUN_TIMEOUT)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except _Hang:
        return {"argv": argv, "outcome": "hang", "detail": err.getvalue()[-2000:]}
    except SystemExit as exc:  # argparse's own exit, or a handler's
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the point: anything escaping is a traceback
        return {"argv": argv, "outcome": "traceback", "detail": traceback.format_exc()[-4000:]}
    finally:
        signal.alarm(0)
    text = err.getvalue()
    if "Traceback (most recent call last)" in text:
        return {"argv": argv, "outcome": "traceback", "detail": text[-4000:]}
    if code == 0:
        return {"argv": argv, "outcome": "ok"}
    errors = [line for line in text.splitlines() if line.startswith("ptrain: error:")]
    message = text[text.find("ptrain: error:"):] if errors else ""
    if code == 2 and len(errors) == 1 and "\n\n" not in message.strip():
        return {"argv": argv, "outcome": "usage", "message": message.strip()[:500]}
    return {"argv": argv, "outcome": f"exit {code}", "detail": text[-3000:]}


def campaign(runs: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    options = candidates()
    results = []
    with tempfile.TemporaryDirectory(prefix="ptrain-fuzz-") as tmp:
        for index in range(runs):
            base = ["fit", "--model", "tests._input_models:Base", "--accelerator", "cpu",
                    "--max-steps", "2", "-p", "no:progress-bar", "--default-root-dir",
                    str(Path(tmp) / f"run{index}")]
            results.append(run_one(base + draw(rng, options)))
    return results


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    results = campaign(args.runs, args.seed)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(json.dumps(counts))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if set(counts) <= {"ok", "usage"} else 1


if __name__ == "__main__":
    sys.exit(main())
