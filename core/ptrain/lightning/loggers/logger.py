"""``lightning.pytorch.loggers.logger``: Lightning's base class of loggers, whose subclasses are
ptrain logger plugins.

A class deriving from :class:`Logger` with Lightning's methods takes part in a run given as
``Trainer(logger=MyLogger())`` and receives what Lightning gives it, on every process (as
Lightning calls it; decorate a method with ``rank_zero_only`` to act on rank 0 only):

- ``log_hyperparams(params)`` once per ``fit``/``validate``, after ``setup``: the module's
  hyperparameters merged with the datamodule's (empty when there are none); then
  ``log_graph(module)`` and ``save()``;
- ``log_metrics(metrics, step)`` at each of ptrain's publish points, with ``epoch`` added to
  what the program logged (``self.log``) as Lightning adds it, and not to a monitor's values
  (``LearningRateMonitor``, ``DeviceStatsMonitor``), as Lightning's monitors write them
  (``step`` is ptrain's: the optimizer steps taken); then ``save()``;
- ``after_save_checkpoint(checkpoint_callback)`` after each checkpoint file written, on rank 0;
- ``finalize("success")`` at the end of each stage, ``finalize("failed")`` after an error.

How: ptrain knows a logger by its hook implementations named ``log_metrics`` and
``log_hyperparams``. So when a subclass is created, its own methods of those names become those
hook implementations (:func:`_hook_form`): a call whose first argument is the trainer comes from
the run and goes to :meth:`Logger._publish_metrics` / :meth:`Logger._publish_hyperparams`, which
call the method with Lightning's arguments; any other call is the method itself, unchanged.
"""

from __future__ import annotations

import abc
import functools
import os
import re
import statistics
from typing import Any, Callable, Mapping, Sequence

from ptrain.hookspecs import hookimpl
from ptrain.trainer import Trainer


def _current_rank() -> int:
    from ptrain.lightning.utilities.rank_zero import rank_zero_only

    rank = getattr(rank_zero_only, "rank", None)
    return int(os.environ.get("RANK", "0")) if rank is None else int(rank)


def _metrics_shape(self: Any, trainer: Any, metrics: Any, step: Any) -> None:
    """The arguments ptrain's ``log_metrics`` hook passes (see :func:`_hook_form`)."""


def _hyperparams_shape(self: Any, trainer: Any, hyperparameters: Any) -> None:
    """The arguments ptrain's ``log_hyperparams`` hook passes (see :func:`_hook_form`)."""


#: Lightning's method name -> (the arguments of ptrain's hook of that name, the Logger method
#: a call from the run goes to)
_HOOK_FORMS = {"log_metrics": (_metrics_shape, "_publish_metrics"),
               "log_hyperparams": (_hyperparams_shape, "_publish_hyperparams")}


def _hook_form(method: Callable[..., Any], shape: Callable[..., Any],
               from_run: str) -> Callable[..., Any]:
    """``method`` (a Lightning logger's ``log_metrics``/``log_hyperparams``) as ptrain's hook
    implementation of the same name that still answers Lightning's calls unchanged."""

    @functools.wraps(method)
    def hook_form(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], Trainer):  # ptrain's hook call: (trainer, ...)
            return getattr(self, from_run)(*args)
        return method(self, *args, **kwargs)

    # pluggy reads which arguments an implementation takes through ``__wrapped__``
    hook_form.__wrapped__ = shape  # type: ignore[attr-defined]
    hook_form._lightning_method = method  # type: ignore[attr-defined]
    return hookimpl(hook_form)


class Logger(abc.ABC):
    """Lightning's ``Logger``: subclass it with ``name``, ``version``, ``log_metrics(metrics,
    step=None)`` and ``log_hyperparams(params)`` (and optionally ``experiment``, ``save_dir``,
    ``log_dir``, ``log_graph``, ``save``, ``finalize``, ``after_save_checkpoint``) and pass an
    instance as ``Trainer(logger=...)``; see the module's docstring for when each is called.

    ``plugin_name`` is the name the logger has among the run's plugins (``trainer.plugins``);
    ``name`` keeps Lightning's meaning (the experiment's name). ``root_dir`` is where the run
    folders go when the logger keeps files (``save_dir/name``); a logger without ``save_dir``
    has none (the attribute is missing, Lightning's is ``None``) and the run folder is then
    ``default_root_dir/lightning_logs/version_N``.
    """

    #: ``self.logger`` is this logger on every process, as in Lightning: its ``experiment`` is
    #: a stand-in off global rank 0, and a subclass's methods act there with ``rank_zero_only``
    serves_every_rank = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, (shape, from_run) in _HOOK_FORMS.items():
            method = cls.__dict__.get(name)
            if callable(method) and not hasattr(method, "_lightning_method"):
                setattr(cls, name, _hook_form(method, shape, from_run))

    @property
    def plugin_name(self) -> str:
        """This logger's name among the run's plugins: its class name in kebab case."""
        return re.sub(r"(?<!^)(?=[A-Z])", "-", type(self).__name__).lower()

    # -- Lightning's interface ----------------------------------------------------------------

    @property
    @abc.abstractmethod
    def name(self) -> str | None:
        """The experiment's name."""

    @property
    @abc.abstractmethod
    def version(self) -> int | str | None:
        """The experiment's version."""

    @abc.abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record ``metrics`` (names to numbers) at ``step``."""

    @abc.abstractmethod
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Record the hyperparameters ``params`` (a dict or an ``argparse.Namespace``)."""

    @property
    def root_dir(self) -> str:
        """``save_dir/name``, where the versions of the experiment go; missing (an
        ``AttributeError``) when the logger keeps no files (``save_dir`` is ``None``)."""
        if self.save_dir is None:
            raise AttributeError(f"{type(self).__name__} keeps no files (its save_dir is None), "
                                 f"so it has no root_dir")
        return os.path.join(self.save_dir, str(self.name or ""))

    @property
    def log_dir(self) -> str | None:
        """The folder of this version of the experiment, or ``None``."""
        return None

    @property
    def save_dir(self) -> str | None:
        """The folder the logger saves into, or ``None`` when it keeps no files."""
        return None

    @property
    def group_separator(self) -> str:
        return "/"

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Record the model's graph (nothing, unless a subclass does)."""

    def save(self) -> None:
        """Write what is buffered (nothing, unless a subclass does)."""

    def finalize(self, status: str) -> None:
        """The experiment ended with ``status`` (``"success"`` or ``"failed"``): save."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """A checkpoint was written (nothing, unless a subclass does)."""

    # -- what the run calls -------------------------------------------------------------------

    #: whether the run calls ``save()`` after each ``log_metrics`` (Lightning does; ptrain's
    #: own file loggers write on their own schedule instead)
    _save_after_publish = True

    def _publish_metrics(self, trainer: Any, metrics: dict[str, float], step: int) -> None:
        values = dict(metrics)
        if trainer.metrics.publishing_logged:  # self.log values: Lightning adds the epoch
            values.setdefault("epoch", trainer.current_epoch)
        self.log_metrics(values, step)
        if self._save_after_publish:
            self.save()

    def _publish_hyperparams(self, trainer: Any, hyperparameters: dict[str, Any]) -> None:
        self.log_hyperparams(dict(hyperparameters))
        self.log_graph(trainer.module)
        self.save()

    _stage_rank: int | None = None  # this process's global rank while a stage runs
    _stage_run_dir: Any = None  # the run folder of the stage under way (every process's)

    def _rank(self) -> int:
        """This process's global rank: the stage's, else what ``rank_zero_only`` says."""
        return self._stage_rank if self._stage_rank is not None else _current_rank()

    # when the stage starts, before the callbacks' Lightning setup (which may read log_dir)
    @hookimpl(specname="on_stage_start", tryfirst=True)
    def _ptrain_stage_starts(self, trainer: Any) -> None:
        self._stage_rank, self._stage_run_dir = trainer.global_rank, trainer.run_dir

    @hookimpl(specname="save_checkpoint", wrapper=True)
    def _ptrain_after_save(self, trainer: Any) -> Any:
        written = yield
        if trainer.is_global_zero:
            self.after_save_checkpoint(trainer.plugins.get("checkpoint"))
        return written

    @hookimpl(specname="teardown", trylast=True)
    def _ptrain_finalize(self, trainer: Any) -> None:
        try:
            self.finalize("failed" if trainer.exception is not None else "success")
        finally:
            self._stage_rank = self._stage_run_dir = None


def rank_zero_experiment(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Decorate a logger's ``experiment`` property getter: on processes other than global rank
    0 it answers a stand-in whose every method does nothing."""

    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        if getattr(self, "_rank", _current_rank)() > 0:
            return _DummyExperiment()
        return fn(self)

    return experiment


class _DummyExperiment:
    """An experiment whose every method does nothing (indexing gives it again)."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Callable[..., None]:
        return self.nop

    def __getitem__(self, index: Any) -> _DummyExperiment:
        return self

    def __setitem__(self, *args: Any) -> None:
        return None


class _DeferredCalls:
    """An experiment asked for before the run made it: each call made through it
    (``experiment.add_text(...)``, ``experiment.config.update(...)``) is kept in ``calls``, to
    be made on the real experiment later (:meth:`make_on`)."""

    def __init__(self, calls: list[tuple[tuple[str, ...], tuple, dict]],
                 path: tuple[str, ...] = ()):
        self._calls, self._path = calls, path

    def __getattr__(self, name: str) -> _DeferredCalls:
        if name.startswith("_") or name.startswith("ptrain_"):
            raise AttributeError(name)
        return _DeferredCalls(self._calls, (*self._path, name))

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._calls.append((self._path, args, kwargs))

    def make_on(self, experiment: Any) -> None:
        """Make the kept calls on ``experiment``, in order, and forget them."""
        calls, self._calls[:] = list(self._calls), []
        for path, args, kwargs in calls:
            target = experiment
            for name in path:
                target = getattr(target, name)
            target(*args, **kwargs)


#: attribute names ptrain reads on a plugin: a DummyLogger must not answer them with a method
_PROTOCOL = {"observe_hook_call", "clips_every_step", "saves_in_weights_only", "state_key",
             "priority", "root_dir", "serves_every_rank"}


class DummyLogger(Logger):
    """A logger that records nothing: every method it is asked for does nothing (Lightning's
    stand-in for a logger turned off)."""

    def __init__(self) -> None:
        self._experiment = _DummyExperiment()

    @property
    def experiment(self) -> _DummyExperiment:
        return self._experiment

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        return None

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        return None

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def __getitem__(self, index: int) -> DummyLogger:
        return self

    def __getattr__(self, name: str) -> Callable[..., None]:
        from ptrain.loading import HOOK_NAMES

        if name.startswith("_") or name in _PROTOCOL or name in HOOK_NAMES:
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> None:
            return None

        return method


def merge_dicts(dicts: Sequence[Mapping[str, Any]], agg_key_funcs: Mapping[str, Any] | None = None,
                default_func: Callable[[Sequence[float]], float] = statistics.mean
                ) -> dict[str, Any]:
    """One dict from ``dicts``: each key's values (``None`` left out) combined by its function
    in ``agg_key_funcs`` (else ``default_func``); nested dicts are merged the same way, with
    the nested mapping of functions."""
    functions = agg_key_funcs or {}
    keys: list[str] = list(dict.fromkeys(key for d in dicts for key in d))
    merged: dict[str, Any] = {}
    for key in keys:
        values = [d[key] for d in dicts if d.get(key) is not None]
        if not values:
            continue
        function = functions.get(key)
        if isinstance(values[0], dict):
            merged[key] = merge_dicts(values, function, default_func)
        else:
            merged[key] = (function or default_func)(values)
    return merged


__all__ = ["DummyLogger", "Logger", "merge_dicts", "rank_zero_experiment"]
