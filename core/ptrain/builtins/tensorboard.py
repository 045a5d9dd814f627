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
"""

from __future__ import annotations

from typing import Any

from ptrain.config import dump_config
from ptrain.hookspecs import hookimpl


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

    def __init__(self) -> None:
        self.writer = None
        self._log_dir: str | None = None  # where this stage's writer opens (rank 0 only)
        # what was given before the writer opened: ("hparams", flat dict | "config", text, step)
        self._pending: list[tuple[str, Any, int]] = []
        self._session_started = False

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` of the run under way (global rank 0 only; ``None`` elsewhere
        and outside a stage): ``self.logger.experiment.add_image(...)`` in a module."""
        return self._open()

    def _open(self) -> Any:
        """This stage's writer, opened (and given what waited for it) on first use."""
        if self.writer is None and self._log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=self._log_dir)
            for kind, value, step in self._pending:
                if kind == "config":
                    self.writer.add_text("config", value, step)
                else:
                    self.writer.file_writer.add_summary(session_start(value), step)
            self._pending.clear()
        return self.writer

    @hookimpl
    def setup(self, trainer) -> None:
        self._session_started = False
        if trainer.is_global_zero and self.writer is None:
            self._log_dir = str(trainer.run_dir)

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
        writer = self._open()
        if writer is not None:
            for name, value in metrics.items():
                writer.add_scalar(name, value, global_step=step)

    @hookimpl
    def on_epoch_end(self) -> None:
        writer = self._open()
        if writer is not None:
            writer.flush()

    @hookimpl
    def teardown(self, trainer) -> None:
        writer = self._open()
        self._log_dir = None
        if writer is None:
            return
        if self._session_started:
            writer.file_writer.add_summary(session_end(trainer.exception is None),
                                           trainer.global_step)
        writer.close()
        self.writer = None


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
