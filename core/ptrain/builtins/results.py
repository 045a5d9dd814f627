"""The ``results`` callback: what a stage loaded and what it ended with, whatever the display.

On by default, independent of the progress bar (``--no-progress-bar`` hides the bar, never the
results); ``-p no:results`` turns it off. Only the global-zero process prints, to stdout:

- when a stage loads a checkpoint, one line before it runs: which file, from which run folder,
  and when the file was written (``last`` and ``best`` name a file only when resolved, so a
  run picked by them is never a surprise);
- when a stage finishes without an error, one line: for ``fit`` the epochs and steps done and
  the time taken, for the others the time taken; then every metric the stage ended with
  (``trainer.callback_metrics``) as ``name=value``.

It reads metrics once per stage, at its end: nothing on the hot path. ``verbose = False`` on
the instance keeps it silent until set back (Lightning's ``trainer.test(verbose=False)``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ptrain.hookspecs import hookimpl

_FINISHED = {"fit": "Training", "validate": "Validation", "test": "Test",
             "predict": "Prediction"}
_LOADED = {"fit": "Resuming from", "validate": "Validating", "test": "Testing",
           "predict": "Predicting with"}


def format_metrics(metrics: dict[str, float]) -> str:
    """``{"b": 0.5, "a": 1.0}`` -> ``"a=1  b=0.5"`` (sorted, four significant digits)."""
    return "  ".join(f"{name}={value:.4g}" for name, value in sorted(metrics.items()))


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it, else absolute."""
    absolute = path.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def owning_run(path: Path) -> Path | None:
    """The run folder a checkpoint lies in (``<run>/checkpoints/<file or shard folder>``, or a
    file of a shard folder), or ``None`` for a checkpoint kept elsewhere."""
    from ptrain.run_folder import is_run_folder

    for parent in list(path.absolute().parents)[:3]:
        if is_run_folder(parent):
            return parent
    return None


def loaded_line(stage: str, checkpoint: str) -> str:
    """The line that says which checkpoint ``stage`` loaded."""
    path = Path(checkpoint)
    run = owning_run(path)
    where = f"run {shown_path(run)}" if run is not None else "outside any run folder"
    try:
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(path).st_mtime))
        when = f", written {written}"
    except OSError:  # gone since it was loaded: the line still names it
        when = ""
    return f"{_LOADED[stage]} checkpoint {shown_path(path)} ({where}{when})."


class StageResults:
    def __init__(self):
        self.verbose = True
        self.enabled = False  # until setup: a run can fail before it
        self.start = 0.0

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self.enabled = self.verbose and trainer.is_global_zero
        self.start = time.monotonic()
        if self.enabled and trainer.ckpt_path is not None:
            print(loaded_line(stage, trainer.ckpt_path), flush=True)

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        if not self.enabled or trainer.exception is not None:
            return
        self.enabled = False
        seconds = time.monotonic() - self.start
        if stage == "fit":
            # the epochs begun (the last may have stopped early), resumed ones included
            state = trainer.loop_state
            epochs = state.get("epoch", 0) + (1 if state.get("batch", 0) else 0)
            what = (f"Training finished: {epochs} epoch(s), {trainer.global_step} steps in "
                    f"{seconds:.1f} s.")
        else:
            what = f"{_FINISHED[stage]} finished in {seconds:.1f} s."
        metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
        print(f"{what} {format_metrics(metrics)}".rstrip(), flush=True)
