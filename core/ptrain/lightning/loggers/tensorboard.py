"""``lightning.pytorch.loggers.tensorboard``: Lightning's ``TensorBoardLogger`` over ptrain's
``tensorboard`` logger plugin."""

from __future__ import annotations

import argparse
import atexit
import warnings
from typing import Any

import torch

from ptrain.builtins.tensorboard import TensorBoardLogger as _TensorBoard
from ptrain.builtins.tensorboard import flat_hparams, session_start
from ptrain.hookspecs import hookimpl
from ptrain.lightning._common import refuse, refuse_unless
from ptrain.lightning.loggers._run_folder import RunFolder
from ptrain.lightning.loggers.logger import Logger, _DeferredCalls, _DummyExperiment


class TensorBoardLogger(RunFolder, Logger, _TensorBoard):
    """Lightning's ``TensorBoardLogger``: event files in the run folder
    (``save_dir/name/version_N``); ``experiment`` is the ``SummaryWriter``.

    Its methods take Lightning's arguments: ``log_metrics(metrics, step=None)`` writes scalars,
    ``log_hyperparams(params, metrics=None, step=None)`` records the hyperparameters for the
    HParams tab (merged with the run's own), ``log_graph(model, input_array=None)`` adds the
    model's graph (with ``log_graph=True``, or ``logger._log_graph = True``, it is added at the
    start of ``fit``/``validate`` from the module's ``example_input_array``, as Lightning does).
    Called before the first stage, what they are given is written when the run folder is
    chosen. ptrain writes no ``hp_metric`` placeholder, so ``default_hp_metric`` changes
    nothing. ``on_write_error`` is the ``tensorboard`` plugin's option (``"stop"``: a write the
    disk refuses stops the run; ``"warn"``: said once, the run goes on); the other keyword
    arguments Lightning hands to the ``SummaryWriter`` are refused.
    """

    plugin_name = "tensorboard"
    _save_after_publish = False  # flushed at each epoch's end, as the tensorboard plugin does

    def __init__(self, save_dir: Any = ".", name: str | None = "lightning_logs",
                 version: Any = None, log_graph: bool = False, default_hp_metric: bool = True,
                 prefix: str = "", sub_dir: Any = None, on_write_error: str = "stop",
                 **kwargs: Any):
        _TensorBoard.__init__(self, on_write_error)
        self._init_folder("TensorBoardLogger", save_dir, name, version, prefix)
        refuse_unless("TensorBoardLogger", {"sub_dir": sub_dir}, {
            "sub_dir": (None, "event files go to the run folder itself"),
        })
        if kwargs:
            argument = next(iter(kwargs))
            raise refuse("TensorBoardLogger", argument, kwargs[argument],
                         "ptrain opens the SummaryWriter itself with its defaults")
        self._log_graph = log_graph
        self.default_hp_metric = default_hp_metric
        self.hparams: dict[str, Any] = {}  # what log_hyperparams was given, as Lightning's
        self._early: list[tuple[dict[str, float], int | None]] = []  # before the writer opened
        # calls made on `experiment` before the writer opened
        self._early_calls: list[tuple[tuple[str, ...], tuple, dict]] = []
        self._graph_warned = False
        self._late_writer = False  # the writer was opened after a stage, by `experiment`

    # -- the writer -------------------------------------------------------------------------

    @property
    def log_dir(self) -> str:
        """The run folder; before the first stage, the one it will choose (the next free
        ``version_N``)."""
        return self.writer.log_dir if self.writer is not None else self._folder()

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` of the run folder on global rank 0 (a stand-in whose methods
        do nothing elsewhere). After a stage it opens on that stage's folder; before the first
        stage, when ptrain has not chosen the folder yet, the calls made on it are kept and made
        on the writer when it opens."""
        if self._rank() > 0:
            return _DummyExperiment()
        writer = self._writer()
        return writer if writer is not None else _DeferredCalls(self._early_calls)

    def _writer(self) -> Any:
        """The writer for a write now: the stage's; after a stage, one on its folder; ``None``
        before the first stage."""
        if self._stage_rank is None and self.writer is None and self._run_dir is not None:
            self._log_dir, self._late_writer = self._run_dir, True  # beside the stage's events
            atexit.register(self._close_late_writer)
        return self._open()

    def _open(self) -> Any:
        opened = self.writer is None
        writer = super()._open()
        if writer is not None and opened:  # a new writer: what was given before it
            if self.hparams:
                writer.file_writer.add_summary(session_start(flat_hparams(self.hparams)), 0)
                self._session_started = True
            early, self._early = self._early, []
            for metrics, step in early:
                self._write_scalars(writer, metrics, step)
            _DeferredCalls(self._early_calls).make_on(writer)
        return writer

    # -- Lightning's methods ---------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Write each metric as a scalar at ``step`` (a dict value as a group of scalars)."""
        if self._rank() > 0:
            return
        writer = self._writer()
        if writer is None:
            self._early.append((dict(metrics), step))
            return
        self._write_scalars(writer, metrics, step)

    @staticmethod
    def _write_scalars(writer: Any, metrics: dict[str, Any], step: int | None) -> None:
        for name, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.item()
            if isinstance(value, dict):
                writer.add_scalars(name, value, global_step=step)
            else:
                writer.add_scalar(name, value, global_step=step)

    def log_hyperparams(self, params: Any, metrics: dict[str, Any] | None = None,
                        step: int | None = None) -> None:
        """Record ``params`` (a dict or ``argparse.Namespace``) for the HParams tab, with the
        hyperparameters given before; ``metrics`` are written as scalars at ``step``."""
        if self._rank() > 0:
            return
        if isinstance(params, argparse.Namespace):
            params = vars(params)
        self.hparams.update(params)
        opened = self.writer is not None
        writer = self._writer()
        if opened and writer is not None:  # a new session record with every value so far
            writer.file_writer.add_summary(session_start(flat_hparams(self.hparams)), step or 0)
            self._session_started = True
        if metrics:
            self.log_metrics(metrics, step or 0)

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Add ``model``'s graph, traced on ``input_array`` (else its ``example_input_array``),
        when ``log_graph`` is on. Without an input it warns, as Lightning does."""
        if not self._log_graph or self._rank() > 0:
            return
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is None:
            if not self._graph_warned:
                self._graph_warned = True
                warnings.warn("TensorBoardLogger(log_graph=True) could not add the graph: "
                              "set the module's example_input_array (an input for forward) or "
                              "call logger.log_graph(model, input_array).", stacklevel=2)
            return
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        input_array = torch.utils._pytree.tree_map(
            lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, input_array)
        self.experiment.add_graph(model, input_array)

    def save(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    # -- the run's hyperparameters come with its configuration as text -----------------------

    def _publish_hyperparams(self, trainer: Any, hyperparameters: dict[str, Any]) -> None:
        _TensorBoard.log_hyperparams(self, trainer, {})  # the configuration's text
        super()._publish_hyperparams(trainer, hyperparameters)

    @hookimpl(specname="setup", tryfirst=True)
    def _writer_of_the_stage(self) -> None:
        self._close_late_writer()  # a writer opened after the last stage gives way
    def _close_late_writer(self) -> None:
        if self._late_writer:
            self._late_writer = False
            if self.writer is not None:
                self.writer.close()
            self.writer, self._log_dir = None, None


__all__ = ["TensorBoardLogger"]
