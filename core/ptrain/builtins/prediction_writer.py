"""The ``prediction-writer`` callback: streams each prediction batch to disk as it is made.

For a prediction set too large to hold: with it, ``Trainer.predict(..., return_predictions=False)``
(and ``ptrain predict -p prediction-writer``) keeps nothing in memory. Each process writes its own
batches, one file each::

    <output_dir>/rank<R>-batch<NNNNNN>.pt    {"predictions": ..., "batch_indices": [...] | None}

``predictions`` is what ``predict_step`` returned, moved to the CPU; ``batch_indices`` are the
dataset indices of the batch where the dataloader's order is fixed (so the files of all ranks can
be put back in dataset order; a distributed sampler repeats a few samples to even out the ranks,
and those appear twice). Files load with ``torch.load(path, weights_only=True)``: the
predictions' containers are written as ``dict``, ``list`` and ``tuple`` (a namedtuple as a tuple
of its fields, an ``OrderedDict`` as a dict), as that loader refuses other classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ptrain.evaluation_loop import to_cpu
from ptrain.hookspecs import hookimpl


class PredictionWriter:
    name = "prediction-writer"  # its entry point's name, also when given as an object

    def __init__(self, output_dir: str | None = None):
        self.output_dir = output_dir
        self.folder: Path | None = None
        self.written = 0

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("output_dir", str,
                    help="folder for the prediction files (default: predictions/ in the run "
                         "folder)")

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self.written = 0
        if stage == "predict":
            self.folder = Path(self.output_dir) if self.output_dir else \
                Path(trainer.run_dir) / "predictions"
            self.folder.mkdir(parents=True, exist_ok=True)

    @hookimpl
    def on_evaluation_batch_end(self, trainer, stage: str, outputs: Any, batch_idx: int) -> None:
        if stage != "predict":
            return
        record = {"predictions": to_cpu(outputs, plain=True),
                  "batch_indices": trainer.batch_indices}
        torch.save(record, self.folder / f"rank{trainer.global_rank}-batch{batch_idx:06d}.pt")
        self.written += 1

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        if stage == "predict" and trainer.exception is None and trainer.is_global_zero:
            print(f"prediction-writer: {self.written} batch file(s) per process in {self.folder}",
                  flush=True)
