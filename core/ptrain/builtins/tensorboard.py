"""The ``tensorboard`` callback: published metrics as TensorBoard scalars, the hyperparameters for
the HParams tab, and the run's configuration as text.

Events go to the run folder (``<default_root_dir>/version_N``), so ``tensorboard --logdir runs``
shows each run. Only global rank 0 writes. Its writer is opened at the first write, not at
``setup`` (importing TensorBoard takes about 0.1 s, which a run's first step need not wait
for): the hyperparameters and configuration given at the start are kept until then, and
``experiment`` opens it when asked.

Hyperparameters are written as the run's hparams *session* (TensorBoard's session-start record,
and a session-end record with the outcome at teardown) into the run folder's own event file:
no second run folder is made (``SummaryWriter.add_hparams`` would make one), and no experiment
record is written, so TensorBoard builds the HParams table from every run under ``--logdir``:
one row per run, a column per hyperparameter seen in any run and per scalar metric. Nested
dicts are flattened with ``/``; values other than bool, int, float and str are shown as text.
The configuration (``trainer.config``) is the text ``config`` (TOML, in the Text tab).

A write the system refuses (a full disk) is met on TensorBoard's writer thread; it is kept there
(Python prints no traceback for it, and the writes after it are dropped, so the file ends where
it was refused) and handled on the training thread at the next publish point or epoch end as
``on_write_error`` says (:mod:`ptrain.builtins.log_writes`): the run stops with the error
(``stop``, the default), or it is said once and training goes on without the log (``warn``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from ptrain.builtins.log_writes import add_write_error_option, refused, write_error_choice
from ptrain.config import dump_config
from ptrain.hookspecs import hookimpl

WHAT = "the TensorBoard log"


def flat_hparams(values: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``values`` as one level of names (nested dicts joined with ``/``) and of the value types
    TensorBoard's HParams plugin holds (others, ``None`` and lists included, as their text)."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_hparams(value, f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


class TensorBoardLogger:
    name = "tensorboard"  # its entry point's name, also when given as an object

    def __init__(self, on_write_error: str = "stop") -> None:
        self.on_write_error = write_error_choice("tensorboard", on_write_error)
        self.writer = None
        self._log_dir: str | None = None  # where this stage's writer opens (rank 0 only)
        # what was given before the writer opened: ("hparams", flat dict | "config", text, step)
        self._pending: list[tuple[str, Any, int]] = []
        self._session_started = False
        self._checkpoint: Any = None  # the run's last.ckpt, named by a refusal's advice
        self._refusal: OSError | None = None  # the first write the system refused
        self._file: str | None = None  # the event file it was refused in
        self._handled = False  # the refusal was raised or said: nothing more is written

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        add_write_error_option(options, "the event file")

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` of the run under way (global rank 0 only; ``None`` elsewhere
        and outside a stage): ``self.logger.experiment.add_image(...)`` in a module. Once its
        file could not be written, what is given to it is dropped."""
        return self._open()

    def _open(self) -> Any:
        """This stage's writer, opened (and given what waited for it) on first use."""
        if self.writer is None and self._log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_writer_threads()
            self.writer = SummaryWriter(log_dir=self._log_dir)
            self._keep_refusals(self.writer)
            for kind, value, step in self._pending:
                if kind == "config":
                    self.writer.add_text("config", value, step)
                else:
                    self.writer.file_writer.add_summary(session_start(value), step)
            self._pending.clear()
        return self.writer

    def _keep_refusals(self, writer: Any) -> None:
        """Have the writer thread keep a refused write for :meth:`_writable` and drop every
        write after it (raised there, the thread would end and each later write on the
        training thread raise it again)."""
        file = getattr(writer.file_writer.event_writer, "_general_file_writer", None)
        if file is None:  # another TensorBoard: its error comes up at the next write instead
            return
        write = file.write

        def kept(data: bytes) -> None:
            if self._refusal is None:
                try:
                    write(data)
                except OSError as exc:
                    self._file, self._refusal = file.filename, exc

        file.write = kept

    def _write(self, write: Callable[[Any], None], stage_over: bool = False) -> None:
        """``write(writer)`` unless there is no writer (not global rank 0, outside a stage) or
        a write was refused. A refusal found (here, or kept by the writer thread) is handled
        as ``on_write_error`` says, once."""
        if self._handled:
            return
        try:
            writer = self._open()
            if writer is not None:
                write(writer)
        except OSError as exc:  # the folder can't be made, or the thread's error raised again
            self._refusal = self._refusal or exc
        if self._refusal is not None:
            self._handled = True
            refused("tensorboard", self.on_write_error, self._file or self._log_dir,
                    self._refusal, WHAT, self._checkpoint, stage_over)

    @hookimpl
    def setup(self, trainer) -> None:
        self._session_started = False
        self._refusal, self._file, self._handled = None, None, False
        if trainer.is_global_zero and self.writer is None:
            self._log_dir = str(self._writes_to(trainer))
            self._checkpoint = trainer.last_checkpoint_path

    def _writes_to(self, trainer) -> Path:
        """The folder this logger writes to in a stage: the run folder."""
        return Path(trainer.run_dir)

    @hookimpl
    def log_hyperparams(self, trainer, hyperparameters: dict[str, Any]) -> None:
        if self._log_dir is None:
            return
        step = trainer.global_step
        if hyperparameters:
            self._pending.append(("hparams", flat_hparams(hyperparameters), step))
            self._session_started = True
        self._pending.append(("config", _as_markdown_code(dump_config(trainer.config)), step))

    @hookimpl
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        def scalars(writer: Any) -> None:
            for name, value in metrics.items():
                writer.add_scalar(name, value, global_step=step)

        self._write(scalars)

    @hookimpl
    def on_epoch_end(self) -> None:
        self._write(lambda writer: writer.flush())

    @hookimpl
    def teardown(self, trainer) -> None:
        def close(writer: Any) -> None:
            if self._session_started:
                writer.file_writer.add_summary(session_end(trainer.exception is None),
                                               trainer.global_step)
            writer.close()

        self._write(close, stage_over=True)
        if self.writer is not None:  # after a refusal: ends its thread (closing twice is fine)
            self.writer.close()
        self._log_dir, self.writer = None, None


def _quiet_writer_threads() -> None:
    """Have Python print no traceback for an ``OSError`` that ends a TensorBoard writer thread:
    the writer raises it again on its next use, on the thread that uses it (where this logger
    handles it). Needed for the event file's first write, made as the writer opens, before
    :meth:`TensorBoardLogger._keep_refusals` can keep it. Python's hook is chained, not
    replaced."""
    try:  # a private class: another TensorBoard may lack it (its thread's traceback stays)
        from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
    except ImportError:
        return
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: Any) -> None:
        if not (isinstance(args.thread, _AsyncWriterThread)
                and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.quiets_tensorboard = True
    threading.excepthook = hook


def _hparams_summary(tag: str, **plugin_data: Any) -> Any:
    """A ``Summary`` carrying one record of TensorBoard's hparams plugin (no tensor value)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    content = HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **plugin_data)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString()))
    return Summary(value=[Summary.Value(tag=tag, metadata=meta)])


def session_start(hparams: dict[str, bool | int | float | str]) -> Any:
    """The hparams plugin's session-start record: this run's hyperparameter values (bool as
    bool, int and float as numbers, str as text)."""
    import time

    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionStartInfo

    info = SessionStartInfo(start_time_secs=time.time())
    for name, value in hparams.items():
        if isinstance(value, bool):
            info.hparams[name].bool_value = value
        elif isinstance(value, (int, float)):
            info.hparams[name].number_value = value
        else:
            info.hparams[name].string_value = value
    return _hparams_summary(metadata.SESSION_START_INFO_TAG, session_start_info=info)


def session_end(success: bool) -> Any:
    """The hparams plugin's session-end record: the run succeeded or failed."""
    import time

    from tensorboard.plugins.hparams import api_pb2, metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionEndInfo

    info = SessionEndInfo(status=api_pb2.STATUS_SUCCESS if success else api_pb2.STATUS_FAILURE,
                          end_time_secs=time.time())
    return _hparams_summary(metadata.SESSION_END_INFO_TAG, session_end_info=info)


def _as_markdown_code(text: str) -> str:
    """TensorBoard renders text as Markdown: indent it so that it shows as it is."""
    return "\n".join("    " + line for line in text.splitlines())
