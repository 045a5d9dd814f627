"""Fault campaign: kill, stop and starve real jobs at random moments, resume them, and check that
no work is lost and no process is left behind (issue 16).

    .venv/bin/python benchmarks/faults.py                 # the full campaign, ~20 minutes
    .venv/bin/python benchmarks/faults.py --quick         # one trial of each kind (the suite's)
    .venv/bin/python benchmarks/faults.py --json out.json # also the raw trials

The jobs are the resume tests' scripts (``tests/_resume_script.py`` on one process,
``tests/_ddp_resume_script.py`` and ``tests/_shard_resume_script.py`` on 2 gloo ranks): shuffled
data, dropout, Adam, an LR scheduler per step, a checkpoint every 3 steps. Each is first run
whole (the reference: its final parameters and the seconds it trains after its first
checkpoint). Then, per trial, with a seeded random generator:

- **kill** (``--kills`` per strategy, default 20): once the job's first checkpoint exists, wait a
  random time within its training time, SIGKILL one of its ranks chosen at random;
- **hung** (``--hangs``, default 10, ``ddp`` and ``fsdp`` in turn, ``--<strategy>-stall-timeout
  2``): the same, with SIGSTOP; the job must end by itself, naming the stopped rank;
- **disk full** (``--disk-fulls``, default 10, one process): the job writes its run on a small
  filesystem (a tmpfs mounted here, else a file-size limit set on the job's processes), which is
  filled at a random moment; the run must stop with the previous checkpoint intact; the disk is
  then emptied.

After each fault the job is resumed with ``ckpt_path="last"`` and run to its end; **resumed
bit-exact** counts the trials whose final parameters equal the reference's bit for bit. **Time
to end the job** is from the fault to the moment no process of the job is left (the process
table); **leftovers** counts processes of the job still running 30 s after the fault (they are
killed then). A rank stopped as its peers finish their part holds nobody up: when it is the
only process left, it is continued (SIGCONT) and must finish the job by itself (the last
column). **Landed in training** counts faults that found every rank of the job still running (a
fault drawn after a rank finished its part lands on a job that is ending, and is still resumed
and compared).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from tests._faults import SmallDisk, kill_marked, marked_pids, start_job  # noqa: E402

#: strategy -> (script, ranks, its arguments: long enough that a fault lands in training)
JOBS = {
    "single-device": ("tests/_resume_script.py", 1, ["--max-epochs", "6"]),
    "ddp": ("tests/_ddp_resume_script.py", 2, ["--max-epochs", "8"]),
    "fsdp": ("tests/_shard_resume_script.py", 2, ["--max-epochs", "6"]),
}
STALL = 2.0
SETTLE = 30.0


@dataclass
class Trial:
    fault: str
    strategy: str
    rank: int
    delay: float
    landed: bool
    seconds_to_end: float | None
    leftovers: int
    named: bool  # the job's output names the rank (hung) or the refusal (disk full)
    previous_intact: bool
    bit_exact: bool
    continued: bool = False  # hung: its peers had finished; sent SIGCONT, it finished the job


def argv_for(strategy: str, root: Path, out: Path, *extra: str) -> list[str]:
    script, _, arguments = JOBS[strategy]
    return [sys.executable, str(REPO / script), "--root", str(root), "--out", str(out),
            *arguments, *extra]


def first_checkpoint(root: Path) -> Path:
    return root / "version_0" / "checkpoints" / "last.ckpt"


def checkpoint_readable(path: Path) -> bool:
    from ptrain.checkpoint_io import safe_load

    try:
        safe_load(path / "meta.pt" if path.is_dir() else path)
    except Exception:
        return False
    return True


def wait_for(predicate, job, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if job.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job ended or stalled before it was ready:\n{job.output()}")
        time.sleep(0.005)


def pid_of_rank(job, rank: int) -> int | None:
    if rank == 0:
        return job.proc.pid
    for pid in marked_pids(job.mark):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    return None


def ended(job, since: float, keep: int | None = None) -> tuple[float | None, int]:
    """Seconds from ``since`` until no process of ``job`` runs, and how many were left after
    ``SETTLE`` seconds (then killed, unless the only one left is ``keep``)."""
    deadline = since + SETTLE
    while time.monotonic() < deadline:
        job.proc.poll()
        if not marked_pids(job.mark):
            return time.monotonic() - since, 0
        time.sleep(0.02)
    left = marked_pids(job.mark)
    if left != [keep]:
        kill_marked(job.mark)
        job.proc.wait()
    return None, len(left)


def reference(strategy: str, work: Path) -> tuple[dict, float]:
    """The job run whole: its result and its training seconds after the first checkpoint."""
    root, out = work / f"ref-{strategy}", work / f"ref-{strategy}.pt"
    job = start_job(argv_for(strategy, root, out), work / f"ref-{strategy}-log")
    wait_for(lambda: first_checkpoint(root).exists(), job)
    start = time.monotonic()
    job.finish(timeout=600)
    if job.proc.returncode != 0:
        raise RuntimeError(f"the reference {strategy} run failed:\n{job.output()}")
    return torch.load(out, weights_only=True), time.monotonic() - start


def resumed_equal(strategy: str, root: Path, out: Path, ref: dict, log: Path,
                  *extra: str) -> bool:
    job = start_job(argv_for(strategy, root, out, "--resume", *extra), log)
    job.finish(timeout=600)
    if job.proc.returncode != 0 or not out.exists():
        print(f"  resume failed ({strategy}):\n{job.output()[-2000:]}", file=sys.stderr)
        return False
    got = torch.load(out, weights_only=True)
    return got["global_step"] == ref["global_step"] and all(
        torch.equal(got["params"][k], v) for k, v in ref["params"].items())


def fault_trial(fault: str, strategy: str, index: int, rng: random.Random, work: Path,
                ref: dict, train_seconds: float, disk: SmallDisk | None) -> Trial:
    base = (disk.path if disk is not None else work) / f"{fault}-{strategy}-{index}"
    root, out, logs = base / "runs", work / f"{fault}-{strategy}-{index}.pt", \
        work / f"{fault}-{strategy}-{index}-logs"
    extra = ("--stall-timeout", str(STALL)) if fault == "hung" else ()
    ranks = JOBS[strategy][1]
    rank = rng.randrange(ranks)
    delay = rng.uniform(0, train_seconds)
    job = start_job(argv_for(strategy, root, out, *extra), logs / "run")
    try:
        wait_for(lambda: first_checkpoint(root).exists(), job)
        time.sleep(delay)
        landed = len(marked_pids(job.mark)) == ranks  # every rank still at work
        at = time.monotonic()
        if fault == "disk-full":
            disk.fill(job.mark)
        else:
            pid = pid_of_rank(job, rank)
            try:
                os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            except (ProcessLookupError, TypeError):  # it ended a moment before
                pid = None
            landed = landed and pid is not None
        if fault == "disk-full":  # the job ends by itself (or finishes): wait for it
            try:
                job.proc.wait(300)
            except Exception:
                pass
        seconds, left = ended(job, at, keep=pid if fault == "hung" else None)
        continued = False
        if fault == "hung" and seconds is None and marked_pids(job.mark) == [pid]:
            # only the stopped rank is left: its peers had finished their part (nothing waited
            # on it). Continued, it must finish the job by itself.
            os.kill(pid, signal.SIGCONT)
            try:
                job.proc.wait(60)
            except Exception:
                pass
            seconds, left = ended(job, time.monotonic())
            continued = seconds is not None
    finally:
        kill_marked(job.mark)
    output = job.output()
    named = {"kill": True,
             "hung": not landed or continued or f"rank {rank} (pid" in output
             and ("stopped responding" in output or "has been stopped" in output),
             "disk-full": not landed or job.proc.returncode == 0
             or "could not write checkpoint" in output}[fault]
    intact = checkpoint_readable(first_checkpoint(root))
    if disk is not None:
        (disk.path / "filler").unlink(missing_ok=True)
    exact = resumed_equal(strategy, root, out, ref, logs / "resume", *extra)
    return Trial(fault, strategy, rank, round(delay, 3), landed,
                 None if seconds is None else round(seconds, 2), left, named, intact, exact,
                 continued if fault == "hung" else False)


def table(trials: list[Trial]) -> str:
    rows = ["| fault | strategy | trials | landed in training | resumed bit-exact | message "
            "names it | previous checkpoint readable | time to end the job: median / max (s) "
            "| leftovers | hung, peers already done: finished when continued |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[Trial]] = {}
    for t in trials:
        groups.setdefault((t.fault, t.strategy), []).append(t)
    for (fault, strategy), group in groups.items():
        times = [t.seconds_to_end for t in group if t.seconds_to_end is not None]
        timing = (f"{statistics.median(times):.2f} / {max(times):.2f}" if times else "-")
        rows.append(f"| {fault} | {strategy} | {len(group)} | "
                    f"{sum(t.landed for t in group)} | {sum(t.bit_exact for t in group)} | "
                    f"{sum(t.named for t in group)} | {sum(t.previous_intact for t in group)} | "
                    f"{timing} | {sum(t.leftovers for t in group)} | "
                    f"{sum(t.continued for t in group) if fault == 'hung' else '-'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="kill trials per strategy")
    p.add_argument("--hangs", type=int, default=10)
    p.add_argument("--disk-fulls", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="one trial of each kind")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.kills, args.hangs, args.disk_fulls = 1, 1, 1
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="ptrain-faults-") as tmp:
        work = Path(tmp)
        refs = {s: reference(s, work) for s in JOBS}
        plan = [("kill", s) for s in JOBS for _ in range(args.kills)]
        plan += [("hung", ("ddp", "fsdp")[i % 2]) for i in range(args.hangs)]
        plan += [("disk-full", "single-device") for _ in range(args.disk_fulls)]
        disk = SmallDisk(work / "disk") if args.disk_fulls else None
        try:
            for index, (fault, strategy) in enumerate(plan):
                ref, seconds = refs[strategy]
                trial = fault_trial(fault, strategy, index, rng, work, ref, seconds,
                                    disk if fault == "disk-full" else None)
                trials.append(trial)
                print(f"{index + 1}/{len(plan)} {json.dumps(asdict(trial))}", file=sys.stderr,
                      flush=True)
        finally:
            if disk is not None:
                disk.close()
        disk_kind = disk.kind if disk is not None else "-"
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, seed {args.seed}, "
          f"stall timeout {STALL:g} s, small disk: {disk_kind}")
    print(table(trials))
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    bad = [t for t in trials if not (t.bit_exact and t.named and t.previous_intact
                                     and t.leftovers == 0 and t.seconds_to_end is not None)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
