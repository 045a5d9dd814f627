"""Public Lightning programs that nobody wrote for ptrain, run under Lightning 2.6.6 and, with only
their import lines changed, under ``ptrain.lightning``; prints what ran and how far apart the
metrics ended (issue 33).

Nothing is fetched and no program's code is kept in this repository: each program is read from a
snapshot of its public repository under ``--mirrors`` (default ``/work/.mirror``, one bare git
folder per repository, ``OWNER+NAME/repo``) at the commit the catalogue names, copied into a
fresh folder, and there its import lines are rewritten (``lightning.pytorch``,
``pytorch_lightning`` and ``lightning`` where it names the trainer's package ->
``ptrain.lightning``; a Hydra config's ``_target_: lightning.pytorch...`` ->
``ptrain.lightning...``).
A notebook (``.ipynb``, or a jupytext ``# %%`` script) becomes a script of its code cells in
order, IPython's ``!``/``%`` lines left out (they install packages or time cells).

Settings, for each program and each framework:

- ``single``: the program as its authors run it (its ``main``, its CLI with small settings, a
  notebook's cells in order), with its own Trainer settings, except that each Trainer it makes
  gets ``limit_train_batches=40`` and ``limit_val/test/predict_batches=10`` where the program
  sets none (``--limit``; ``--full`` for none), and ``max_epochs`` at most the catalogue's
  ``max_epochs`` where it names one: on a shared two-core machine several programs as written
  take hours (MNIST's 55,000 images a epoch, a notebook's 180 epochs);
- ``ddp``, ``bf16``, ``unbroken``, ``resume``: the program's own classes imported unchanged,
  under a Trainer the harness builds (``lightning_programs/drive.py``, the catalogue's recipe),
  with strategy ddp on 2 CPU processes, with precision bf16-mixed, as the recipe says
  (``unbroken``), and stopped after one epoch (``trainer.should_stop``, the recipe's
  ``max_epochs`` kept: a schedule built over them is the unbroken run's), checkpointed, then
  resumed in a new process to the recipe's epochs (``resume``). A program with its own options for these (Hydra's
  ``trainer=ddp_sim``, ``ckpt_path=...``) runs through them instead.

A resumed ptrain run is compared with Lightning's ``unbroken`` run where there is one: ptrain
restores the random generators a checkpoint holds, so its resume is meant to end where the
unbroken run ends, while Lightning's own resume draws new dropout masks and shuffles (its
distance from ptrain's resume is kept as ``vs_lightning_resume``).

What is compared: the last ``fit``'s ``trainer.callback_metrics`` and every ``test``'s results,
recorded by the probe (``lightning_programs/probe/sitecustomize.py``, on ``PYTHONPATH`` of every
process), within the tolerance of ``tests/test_lightning_dropin.py`` (relative 1e-6, absolute
1e-7). Under ddp each side's value is the mean over its ranks: ptrain reduces every logged value
over the processes where Lightning reports each rank's own (a documented difference), so
Lightning's ranks' values are averaged to compare like with like (a spawned job's workers leave
no record: there rank 0's is compared). Data the programs would
download is made locally (``lightning_programs/data.py``) and linked where each program looks.

    python benchmarks/lightning_programs.py [--only NAME ...] [--configs single,ddp,bf16,resume]
        [--frameworks lightning,ptrain] [--out DIR] [--list]

Programs needing torchvision run in a second environment (``--tv-python``, default
``/work/venv-tv/bin/python``; see ``lightning_programs/README.md``), the others in this one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "lightning_programs"
REPO = HERE.parents[1]
CONFIGS = ("single", "ddp", "bf16", "unbroken", "resume")
FRAMEWORKS = ("lightning", "ptrain")
TOLERANCE = {"single": 1e-6, "bf16": 1e-6, "unbroken": 1e-6, "resume": 1e-6, "ddp": 1e-6}
ABSOLUTE = 1e-7


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"lp_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the rewrite -------------------------------------------------------------------------------

_IMPORT = re.compile(r"^(\s*(?:import|from)\s+)(lightning\.pytorch|pytorch_lightning)\b",
                     re.MULTILINE)
_BARE_IMPORT = re.compile(r"^(\s*import\s+)lightning(\s+as\s+\w+)", re.MULTILINE)
_BARE_FROM = re.compile(r"^(\s*from\s+)lightning(\s+import\b)", re.MULTILINE)
_TARGET = re.compile(r"^(\s*_target_:\s*['\"]?)(lightning\.pytorch|pytorch_lightning)\b",
                     re.MULTILINE)


def port(source: str) -> str:
    """``source`` with only its import lines naming Lightning's trainer switched to
    ``ptrain.lightning`` (``lightning.fabric`` and everything that is not an import stay)."""
    source = _IMPORT.sub(r"\1ptrain.lightning", source)
    source = _BARE_IMPORT.sub(r"\1ptrain.lightning\2", source)
    return _BARE_FROM.sub(r"\1ptrain.lightning\2", source)


def port_yaml(source: str) -> str:
    """A Hydra config with its ``_target_`` strings naming Lightning switched to ptrain."""
    return _TARGET.sub(r"\1ptrain.lightning", source)


# -- notebooks ---------------------------------------------------------------------------------

def notebook_cells(text: str, kind: str) -> list[str]:
    """The code cells of a notebook, in order: ``ipynb`` (JSON) or ``jupytext`` (``# %%``)."""
    if kind == "ipynb":
        book = json.loads(text)
        return ["".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code"]
    cells, current = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("# %%"):
            if current and not current[0].startswith("# %% [markdown]"):
                cells.append("".join(current))
            current = []
        current.append(line)
    if current and not current[0].startswith("# %% [markdown]"):
        cells.append("".join(current))
    return cells


def without_magics(cell: str) -> str:
    """A cell with IPython's shell (``!``) and magic (``%``) lines replaced by ``pass``."""
    out = []
    for line in cell.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("!", "%")):
            out.append(line[:len(line) - len(stripped)] + "pass  # IPython line left out")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def notebook_script(text: str, kind: str, pick: list[int] | None) -> str:
    cells = notebook_cells(text, kind)
    chosen = range(len(cells)) if pick is None else pick
    return "\n".join(f"# --- cell {i}\n" + without_magics(cells[i]) for i in chosen)


# -- one run -----------------------------------------------------------------------------------

def git_show(mirror: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(mirror), "show", f"{commit}:{path}"],
                          check=True, capture_output=True).stdout


def git_files(mirror: Path, commit: str, folder: str) -> list[str]:
    out = subprocess.run(["git", "--git-dir", str(mirror), "ls-tree", "-r", "--name-only",
                          commit, "--", folder], check=True, capture_output=True, text=True)
    return out.stdout.split()


def lay_out(program: dict, framework: str, folder: Path, mirrors: Path, cache: Path) -> None:
    """The program's files in ``folder`` at their repository paths (imports rewritten for
    ptrain), the notebook scripts made, and its data linked in."""
    mirror = mirrors / program["mirror"] / "repo"
    paths = []
    for item in program.get("tree", [program["path"]]):
        paths.extend(git_files(mirror, program["commit"], item) if item.endswith("/")
                     else [item])
    for rel in paths:
        data = git_show(mirror, program["commit"], rel)
        if framework == "ptrain" and rel.endswith(".py"):
            data = port(data.decode()).encode()
        elif framework == "ptrain" and rel.endswith((".yaml", ".yml")):
            data = port_yaml(data.decode()).encode()
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    kind = program.get("kind", "script")
    if kind in ("ipynb", "jupytext"):
        text = (folder / program["path"]).read_text()
        where = (folder / program["path"]).parent
        stem = program["name"].replace("-", "_")
        script = notebook_script(text, kind, program.get("cells"))
        defs = notebook_script(text, kind, program.get("defs_cells", []))
        if framework == "ptrain":
            script, defs = port(script), port(defs)
        (where / f"{stem}_run.py").write_text(script)
        (where / f"{stem}_defs.py").write_text(defs)
    data = _load("data")
    for kind_, link in program.get("data", []):
        made = data.prepare(kind_, cache)
        target = folder / link
        target.mkdir(parents=True, exist_ok=True)
        for entry in made.iterdir():
            dest = target / entry.name
            if not dest.exists():
                dest.symlink_to(entry)


def _first_error(stderr: str, program_dir: Path) -> tuple[str, str]:
    """The exception line of the last traceback and the deepest line of the program's own
    files in it."""
    blocks = stderr.split("Traceback (most recent call last):")
    if len(blocks) < 2:
        tail = [ln for ln in stderr.splitlines() if ln.strip()]
        return (tail[-1][:300] if tail else ""), ""
    block = blocks[-1]
    lines = block.splitlines()
    error = ""
    for line in lines[1:]:
        if line and not line.startswith(" ") and \
                re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b", line):
            error = line
    program_line = ""
    frame = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
    for i, line in enumerate(lines):
        m = frame.match(line)
        if m and str(program_dir) in m.group(1) and "/site-packages/" not in m.group(1) \
                and "lightning_programs" not in m.group(1):
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            program_line = f"{Path(m.group(1)).relative_to(program_dir)}:{m.group(2)}: {code}"
    return error[:400], program_line


def run_once(program: dict, framework: str, config: str, work: Path, args) -> dict:
    folder = work / program["name"] / config / framework
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    lay_out(program, framework, folder, args.mirrors, args.cache)
    probes = folder / "_probe"
    probes.mkdir()
    python = args.tv_python if program.get("venv") == "tv" else sys.executable
    env = {**os.environ, "LP_PROBE_DIR": str(probes), "PYTHONHASHSEED": "0",
           "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "HYDRA_FULL_ERROR": "1", "PYTHONUNBUFFERED": "1",
           "NO_COLOR": "1", "PYTHONPATH": _pythonpath(program), **program.get("env", {})}
    env.pop("PTRAIN_TRACE", None)
    if program.get("standins"):
        env["LP_STANDIN_ROOT"] = str(folder)
    if args.shims:
        env["LP_SHIMS"] = "1"
    if config == "single" and not args.full:
        env["LP_LIMIT_BATCHES"] = args.limit
        if "max_epochs" in program:
            env["LP_MAX_EPOCHS"] = str(program["max_epochs"])
    where = folder / program.get("cwd", str(Path(program["path"]).parent))
    steps = _commands(program, framework, config, folder, where, python)
    started = time.time()
    out = {"ran": False, "seconds": None, "shims": bool(args.shims),
           "limit_batches": env.get("LP_LIMIT_BATCHES"),
           "max_epochs": env.get("LP_MAX_EPOCHS"), "folder": str(folder),
           "ptrain_commit": _head(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    log = []
    for step_no, (command, cwd) in enumerate(steps):
        try:
            proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=program.get("timeout", args.timeout))
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = "timeout"
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            stderr += f"\nTimeoutError: no end after {program.get('timeout', args.timeout)} s"
        (folder / f"_step{step_no}.out").write_text(stdout)
        (folder / f"_step{step_no}.err").write_text(stderr)
        log.append({"command": command[1:], "rc": rc})
        if rc != 0:
            out["error"], out["program_line"] = _first_error(stderr, folder)
            out["rc"] = rc
            break
        if config == "resume" and step_no == 0 and program.get("hydra"):
            ckpts = sorted(folder.rglob("*.ckpt"), key=lambda p: p.stat().st_mtime)
            if not ckpts:
                out["error"] = "the first half of the resume run wrote no checkpoint"
                rc = 1
                break
            steps[1][0][-1] = f"ckpt_path={ckpts[-1]}"
    else:
        out["ran"] = True
    out["seconds"] = round(time.time() - started, 1)
    out["steps"] = log
    out["metrics"], out["probe_errors"] = _metrics_from_probes(
        probes, steps[-1][0], mean_over_ranks=config == "ddp")
    return out


def _pythonpath(program: dict) -> str:
    """The probe first, then the stand-ins for a program marked ``standins``, then the caller's
    own ``PYTHONPATH`` (a checkout's ``core`` and plugins put there are the ptrain that runs)."""
    parts = [str(HERE / "probe")]
    if program.get("standins"):
        parts.append(str(HERE / "standins"))
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def _head() -> str:
    """ptrain's commit (``+`` when the working tree differs from it): the code a run used."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "core",
                            "plugins"], capture_output=True, text=True).stdout.strip()
    return head + ("+" if dirty else "")


def _commands(program: dict, framework: str, config: str, folder: Path, where: Path,
              python: str) -> list[tuple[list[str], Path]]:
    kind = program.get("kind", "script")
    stem = program["name"].replace("-", "_")
    if config == "single" or (program.get("hydra") and config != "resume"):
        argv = list(program.get("argv", []))
        if program.get("hydra"):
            argv += program["hydra"].get(config, [])
        script = f"{stem}_run.py" if kind in ("ipynb", "jupytext") else \
            Path(program["path"]).name
        if program.get("hydra"):
            script = program["path"]
        return [([python, str((folder / script) if program.get("hydra") else script),
                  *argv], where)]
    if program.get("hydra"):  # resume through the template's own ckpt_path option
        argv = list(program.get("argv", []))
        first = [python, str(folder / program["path"]), *argv, *program["hydra"]["resume1"]]
        second = [python, str(folder / program["path"]), *argv, *program["hydra"]["resume2"],
                  "ckpt_path=PLACEHOLDER"]
        return [(first, where), (second, where)]
    if not program.get("build"):
        raise KeyError("no recipe")
    module = program.get("module") or (
        f"{stem}_defs" if kind in ("ipynb", "jupytext") else Path(program["path"]).stem)
    build = folder / "_build.py"
    build.write_text(program["build"])
    package = "ptrain" if framework == "ptrain" else program.get("package", "lightning.pytorch")
    drive = [python, str(HERE / "drive.py"), package, str(where), module, str(build)]
    if config != "resume":
        return [([*drive, config], where)]
    ckpt = str(folder / "_mid.ckpt")
    return [([*drive, "resume1", ckpt], where), ([*drive, "resume2", ckpt], where)]


def _metrics_from_probes(probes: Path, last_argv: list[str],
                         mean_over_ranks: bool = False) -> tuple[dict, list[str]]:
    """The record of the process that ran ``last_argv`` (the run's last command: the second
    half of a resume), falling back to a rank-0 process's when it has none: each ``fit``'s
    callback_metrics (``fitN/name``) and each ``test``'s results (``testN.D/name``, D the
    dataloader). ``mean_over_ranks``: each metric's mean over the ranks that ran
    ``last_argv`` (the other ranks of a job the script launcher started leave records too),
    for the names every rank has."""
    found = []
    for path in probes.glob("probe-*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    # a process's sys.argv is its command without the interpreter
    last_argv = [str(a) for a in last_argv][1:]
    main = [p for p in found if p["argv"] == last_argv and p.get("rank") in (None, "0")]
    main = main or [p for p in found if p.get("rank") in (None, "0") and p["records"]]
    records = max(main, key=lambda p: len(p["records"]))["records"] if main else []
    metrics = _metrics_of(records)
    if mean_over_ranks and metrics:
        others = [_metrics_of(p["records"]) for p in found
                  if p["argv"] == last_argv and p.get("rank") not in (None, "0")]
        every = [metrics, *[m for m in others if m]]
        metrics = {key: sum(m[key] for m in every) / len(every)
                   for key in metrics if all(key in m for m in every)}
    errors = [r["error"] for r in records if r.get("error")]
    return metrics, errors


def _metrics_of(records: list[dict]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    fits = [r for r in records if r["stage"] == "fit"]
    for i, record in enumerate(fits):
        for key, value in record.get("callback_metrics", {}).items():
            metrics[f"fit{i}/{key}"] = value
    tests = [r for r in records if r["stage"] == "test"]
    for i, record in enumerate(tests):
        for j, result in enumerate(record.get("result") or [record.get("callback_metrics", {})]):
            for key, value in result.items():
                metrics[f"test{i}.{j}/{key}"] = value
    return metrics


def rescan(work: Path, results: dict) -> None:
    """Metrics and comparisons read again from the probe files kept under ``work``."""
    for name, rows in results.items():
        for config, row in rows.items():
            for framework in FRAMEWORKS:
                entry = row.get(framework)
                folder = entry.get("folder") if entry else None
                probes = Path(folder or work / name / config / framework) / "_probe"
                if entry and entry.get("steps") and probes.is_dir():
                    argv = ["python", *entry["steps"][-1]["command"]]
                    entry["metrics"], entry["probe_errors"] = _metrics_from_probes(
                        probes, argv, mean_over_ranks=config == "ddp")
                    errs = sorted(probes.parent.glob("_step*.err"))
                    if not entry.get("ran") and errs:
                        entry["error"], entry["program_line"] = _first_error(
                            errs[-1].read_text(), probes.parent)
            set_compare(rows, config)


def set_compare(rows: dict, config: str) -> None:
    """``rows[config]["compare"]``: ptrain's metrics against Lightning's of the same setting;
    for ``resume``, against Lightning's ``unbroken`` run when it ran (see the module's
    docstring), with the distance from Lightning's own resume beside it."""
    row = rows[config]
    reference = row.get("lightning")
    unbroken = rows.get("unbroken", {}).get("lightning") if config == "resume" else None
    if unbroken and unbroken.get("ran"):
        reference = unbroken
    if not (reference and row.get("ptrain")):
        return
    row["compare"] = compare(reference["metrics"], row["ptrain"]["metrics"], TOLERANCE[config])
    if reference is unbroken:
        row["compare"]["against"] = "Lightning unbroken"
        if row.get("lightning", {}).get("ran"):
            own = compare(row["lightning"]["metrics"], row["ptrain"]["metrics"], math.inf)
            row["compare"]["vs_lightning_resume"] = own["max_rel"]


def compare(a: dict, b: dict, rel: float) -> dict:
    """Names in both, the largest relative difference, whether all are within tolerance, and
    the names only one side has."""
    shared = sorted(set(a) & set(b))
    worst, worst_key, within = 0.0, None, True
    for key in shared:
        x, y = a[key], b[key]
        if math.isnan(x) and math.isnan(y):
            continue
        diff = abs(x - y)
        scale = abs(x) if abs(x) > 0 else 1.0
        r = diff / scale if math.isfinite(diff) else math.inf
        if r > worst:
            worst, worst_key = r, key
        if not diff <= ABSOLUTE + rel * abs(x):
            within = False
    return {"compared": len(shared), "max_rel": worst, "worst": worst_key,
            "within": within and bool(shared) and set(a) == set(b),
            "only_lightning": sorted(set(a) - set(b)), "only_ptrain": sorted(set(b) - set(a))}


# -- the table ---------------------------------------------------------------------------------

def _cell(result: dict) -> str:
    if result is None:
        return "-"
    if result.get("skipped"):
        return "skip"
    shim = " (shims)" if result.get("shims") else ""
    return f"{'ran' if result['ran'] else 'FAIL'} {result['seconds']:.0f}s{shim}"


def table(catalogue: list[dict], results: dict) -> str:
    lines = ["| program | source | setting | Lightning | ptrain | metrics | max rel. diff "
             "| verdict | first error |", "|" + " --- |" * 9]
    for program in catalogue:
        name = program["name"]
        for config, entry in results.get(name, {}).items():
            lt, pt = entry.get("lightning"), entry.get("ptrain")
            cmp_ = entry.get("compare") or {}
            against = cmp_.get("against")
            if pt and pt.get("skipped"):
                verdict, error = "not run", pt["skipped"]
            elif lt and pt and not lt.get("ran") and not pt.get("ran"):
                verdict, error = "both fail", pt.get("error", "")
            elif lt and not lt.get("ran") and not against:
                verdict, error = "Lightning fails", lt.get("error", "")
            elif pt and not pt.get("ran"):
                verdict, error = "ptrain fails", pt.get("error", "")
            elif not cmp_.get("compared") and not cmp_.get("only_lightning") \
                    and not cmp_.get("only_ptrain"):
                verdict = "both ran"
                error = "no metric to compare: the program trains nothing as written"
            elif cmp_.get("within"):
                verdict, error = "match", ""
                if against:
                    verdict = f"match ({against})"
                    if cmp_.get("vs_lightning_resume") is not None:
                        error = f"Lightning's resume: {cmp_['vs_lightning_resume']:.2e} apart"
                    elif lt and not lt.get("ran"):
                        error = f"Lightning's resume fails: {lt.get('error', '')}"
            else:
                verdict = "differs"
                bits = []
                if cmp_.get("only_lightning"):
                    bits.append("only Lightning has " + ", ".join(cmp_["only_lightning"][:4]))
                if cmp_.get("only_ptrain"):
                    bits.append("only ptrain has " + ", ".join(cmp_["only_ptrain"][:4]))
                if cmp_.get("worst"):
                    bits.append(f"worst {cmp_['worst']}"
                                + (f" (against {against})" if against else ""))
                error = "; ".join(bits)
            diff = f"{cmp_['max_rel']:.2e}" if cmp_.get("compared") else "-"
            n = str(cmp_.get("compared", "-"))
            error = error.replace("|", "\\|")[:160]
            lines.append(f"| {name} | {program['source']} | {config} | {_cell(lt)} | "
                         f"{_cell(pt)} | {n} | {diff} | {verdict} | {error} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--cache", type=Path, default=None,
                        help="where the made data sets are kept (default: under --work)")
    parser.add_argument("--work", type=Path, default=None, help="run folders (default: a temp "
                        "folder, removed unless --keep)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--tv-python", default="/work/venv-tv/bin/python")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json and "
                        "table.md (merged into what is there)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--limit", default="40,10", help="single: limit_train_batches and "
                        "limit_val/test/predict_batches given to each Trainer the program makes "
                        "where it sets none (default 40,10; the same under both frameworks)")
    parser.add_argument("--full", action="store_true", help="single: no limit (hours for "
                        "several programs on two cores)")
    parser.add_argument("--shims", action="store_true", help="diagnostic: supply the modules "
                        "ptrain lacks (probe/sitecustomize.py) to find what breaks after them")
    parser.add_argument("--merge", nargs="*", type=Path, default=None, help="only combine the "
                        "results.json of these folders (runs made side by side) into --out, "
                        "with --work: metrics read again from the probe files kept there")
    args = parser.parse_args(argv)
    catalogue = _load("catalogue").PROGRAMS
    if args.merge is not None:
        merged: dict = {}
        for folder in args.merge:
            if not (folder / "results.json").exists():
                continue
            for name, rows in json.loads((folder / "results.json").read_text())["results"].items():
                for config, row in rows.items():
                    merged.setdefault(name, {}).setdefault(config, {}).update(row)
        if args.work:
            rescan(args.work, merged)
        if args.out:
            _save(args.out, catalogue, merged)
        print(table(catalogue, merged))
        return 0
    if args.list:
        for p in catalogue:
            print(f"{p['name']:28} {p['repository']}@{p['commit'][:10]} {p['path']}")
        return 0
    chosen = [p for p in catalogue if args.only is None or p["name"] in args.only]
    missing = sorted({p["mirror"] for p in chosen
                      if not (args.mirrors / p["mirror"] / "repo").is_dir()})
    if missing:
        print("snapshots missing under", args.mirrors, ":", ", ".join(missing))
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="lightning-programs-"))
    args.cache = args.cache or work / "_data"
    results: dict = {}
    if args.out and (args.out / "results.json").exists():
        results = json.loads((args.out / "results.json").read_text())["results"]
    configs = args.configs.split(",")
    try:
        for program in chosen:
            entry = results.setdefault(program["name"], {})
            for config in configs:
                if config != "single" and not (program.get("build") or program.get("hydra")):
                    continue
                row = entry.setdefault(config, {})  # a framework not run keeps its result
                row.pop("compare", None)
                for framework in args.frameworks.split(","):
                    print(f"[{time.strftime('%H:%M:%S')}] {program['name']} {config} "
                          f"{framework}", flush=True)
                    row[framework] = run_once(program, framework, config, work, args)
                set_compare(entry, config)
                if args.out:
                    _save(args.out, catalogue, results)
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(catalogue, results))
    if args.out:
        _save(args.out, catalogue, results)
    return 0


def _save(out: Path, catalogue: list[dict], results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ptrain_commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                   capture_output=True, text=True).stdout.strip()
    (out / "results.json").write_text(json.dumps(
        {"ptrain_commit": ptrain_commit, "results": results}, indent=1, sort_keys=True))
    (out / "table.md").write_text(table(catalogue, results) + "\n")


if __name__ == "__main__":
    sys.exit(main())
