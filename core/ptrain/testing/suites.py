"""Conformance suites: the tests every plugin of a kind must pass, for plugin authors to inherit.

::

    from ptrain.testing import CallbackSuite

    class TestMyCallback(CallbackSuite):
        plugin = "my-callback"              # the entry-point name (or the plugin class)
        options = {"size": 3}               # its plugin options, if it needs some

pytest then collects the inherited tests. Each suite trains :class:`TinyModule` (or what
``module_factory`` makes) twice: a fit of ``max_epochs`` epochs with the plugin, and a run
resumed from the checkpoint that fit wrote after its first epoch; the tests check those two
runs (and, for callbacks, a run without the plugin). A suite whose plugin, or the accelerator
it runs on, can't run on this machine (``check_available``) is skipped with the plugin's own
reason: no hardware is ever imitated.
"""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, ClassVar

import pytest
import torch

from ptrain.catalog import Catalog
from ptrain.errors import PluginError
from ptrain.hookspecs import PROJECT_NAME
from ptrain.loading import check_available, import_target
from ptrain.module import TrainModule
from ptrain.precision_policy import PrecisionPolicy
from ptrain.selection import object_name
from ptrain.testing.models import TinyModule
from ptrain.testing.probes import (LOADED_STATE, RESUME_CHECKPOINT, SAVED_STATE, ResumeProbe,
                                   StepProbe)
from ptrain.testing.recorder import HookCall, HookRecorder
from ptrain.testing.runs import run_fit
from ptrain.trainer import Trainer

#: A fit must bring the training loss below this fraction of where it started.
LOSS_DROP = 0.9
_PER_PLUGIN_HOOKS = ("state_dict", "load_state_dict")
_HOOK_RECORDS = "hooks"  # the folder of a run's out_dir where worker processes save their calls


@dataclass
class SuiteRun:
    """One run of a suite: the fitted trainer and module, the loss before and after, and the
    folder its probes wrote to."""

    trainer: Trainer
    module: TrainModule
    loss_before: float
    loss_after: float
    out_dir: Path


def _full_loss(module: TrainModule) -> float:
    full_loss = getattr(module, "full_loss", None)
    if not callable(full_loss):
        pytest.fail(f"{type(module).__qualname__} (from module_factory) has no full_loss() "
                    f"method; the suites measure training with it. Subclass "
                    f"ptrain.testing.TinyModule, or add full_loss() -> float.")
    return float(full_loss())


def assert_same_state(saved: Any, loaded: Any, where: str = "state") -> None:
    """Assert that two plugin states (tensors and plain values, nested) are equal: tensors
    in dtype, shape and every element (NaN equal to NaN), floats exactly."""
    if isinstance(saved, torch.Tensor) or isinstance(loaded, torch.Tensor):
        assert isinstance(saved, torch.Tensor) and isinstance(loaded, torch.Tensor), (
            f"{where}: {type(saved).__name__} saved, {type(loaded).__name__} after the resume")
        assert saved.dtype == loaded.dtype and saved.shape == loaded.shape, (
            f"{where}: {saved.dtype}{tuple(saved.shape)} saved, {loaded.dtype}"
            f"{tuple(loaded.shape)} after the resume")
        a, b = saved.detach().cpu(), loaded.detach().cpu()
        same = torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                     and torch.equal(torch.where(a.isnan(), 0, a),
                                                     torch.where(b.isnan(), 0, b)))
        assert same, f"{where}: the values differ after the resume"
    elif isinstance(saved, dict) and isinstance(loaded, dict):
        assert set(saved) == set(loaded), (
            f"{where}: keys {sorted(map(str, saved))} saved, {sorted(map(str, loaded))} after "
            f"the resume")
        for key in saved:
            assert_same_state(saved[key], loaded[key], f"{where}[{key!r}]")
    elif isinstance(saved, (list, tuple)) and isinstance(loaded, (list, tuple)):
        assert len(saved) == len(loaded), f"{where}: length {len(saved)} saved, {len(loaded)} after"
        for i, (a, b) in enumerate(zip(saved, loaded)):
            assert_same_state(a, b, f"{where}[{i}]")
    elif isinstance(saved, float) and isinstance(loaded, float) and math.isnan(saved):
        assert math.isnan(loaded), f"{where}: nan saved, {loaded!r} after the resume"
    else:
        assert saved == loaded, f"{where}: {saved!r} saved, {loaded!r} after the resume"


def _same_device(tensor_device: str, device: torch.device) -> bool:
    seen = torch.device(tensor_device)
    if seen.type != device.type:
        return False
    return seen.index is None or device.index is None or seen.index == device.index


@lru_cache(maxsize=1)
def _plugins_listing() -> tuple[str, list[dict[str, Any]]]:
    """``ptrain plugins --json``, run once per session as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "ptrain", "plugins", "--json"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {proc.stderr.strip()}", []
    return "", json.loads(proc.stdout)


class PluginSuite:
    """What every suite shares; subclass a kind's suite, not this one.

    Class attributes a test class sets: ``plugin`` (the installed plugin's name, or the plugin
    class itself before it is installed), ``options`` (its options: the plugin options of a
    name, the constructor's keyword arguments of a class), ``module_factory`` (makes the
    :class:`ptrain.TrainModule` to train, default :class:`TinyModule`; its module needs
    ``full_loss()``), ``trainer_options`` (more :class:`ptrain.Trainer` options, e.g.
    ``{"accelerator": "cuda"}`` for a plugin that needs one), ``max_epochs`` (2, at least 2) and
    ``exact_resume`` (``True``: a resumed run must end with exactly the weights of an unbroken
    one; set ``False`` only for a plugin that is deliberately not deterministic).
    """

    kind: ClassVar[str] = ""
    plugin: ClassVar[str | type | None] = None
    options: ClassVar[dict[str, Any]] = {}
    module_factory: ClassVar[Callable[[], TrainModule]] = TinyModule
    trainer_options: ClassVar[dict[str, Any]] = {}
    max_epochs: ClassVar[int] = 2
    exact_resume: ClassVar[bool] = True

    # -- what to run -----------------------------------------------------------------------

    @classmethod
    def _plugin_name(cls) -> str:
        if cls.plugin is None:
            pytest.fail(f"{cls.__name__} must set `plugin` to the {cls.kind} plugin's name (or "
                        f"class).")
        if isinstance(cls.plugin, str):
            return cls.plugin
        return object_name(cls.plugin)

    @classmethod
    def _make_module(cls) -> TrainModule:
        factory = inspect.getattr_static(cls, "module_factory")
        if isinstance(factory, (staticmethod, classmethod)):
            factory = factory.__get__(None, cls)
        module = factory()
        if not isinstance(module, TrainModule):
            pytest.fail(f"{cls.__name__}.module_factory made a {type(module).__qualname__}, not "
                        f"a ptrain.TrainModule.")
        return module

    @classmethod
    def _selection(cls, with_plugin: bool = True) -> dict[str, Any]:
        """The Trainer options of the suite's runs: with the plugin under test, or (for a
        callback) without it, blocked if it is on by default."""
        if not with_plugin:
            options = {**cls.trainer_options}
            if isinstance(cls.plugin, str):
                options["callbacks"] = [*options.get("callbacks", []), f"no:{cls.plugin}"]
            return options
        if isinstance(cls.plugin, str):
            chosen: Any = cls.plugin
            plugin_options = {cls.plugin: dict(cls.options)} if cls.options else {}
        else:
            chosen, plugin_options = cls.plugin(**cls.options), {}
        options = {**cls.trainer_options}
        if plugin_options:
            options["plugin_options"] = {**options.get("plugin_options", {}), **plugin_options}
        if cls.kind == "callback":
            options["callbacks"] = [*options.get("callbacks", []), chosen]
        else:
            options[cls.kind] = chosen
        return options

    @classmethod
    def _unavailable(cls) -> str | None:
        """Why the plugin under test (or the accelerator its runs use) can't run here."""
        catalog = Catalog.discover()
        checks: list[tuple[str, Any]] = [(cls.kind, cls.plugin)]
        accelerator = cls.trainer_options.get("accelerator")
        if cls.kind != "accelerator" and isinstance(accelerator, str) and accelerator != "auto":
            checks.append(("accelerator", accelerator))
        for kind, plugin in checks:
            if isinstance(plugin, str):
                target = import_target(catalog.get(kind, plugin))  # not installed: an error
                name = plugin
            else:
                target, name = plugin, object_name(plugin)
            reason = check_available(target, name)
            if reason is not None:
                return f"{kind} {name!r} can't run on this machine: {reason}"
        return None

    @classmethod
    def _extra_callbacks(cls, out_dir: Path) -> list[Any]:
        """Callbacks a suite adds to its first run (probes, a recorder); ``out_dir`` is the
        run's folder, where probes in worker processes write what they saw."""
        return []

    @classmethod
    def _fit(cls, out_dir: Path, *, callbacks: list[Any], ckpt_path: Path | None = None,
             selection: dict[str, Any] | None = None) -> SuiteRun:
        module = cls._make_module()
        before = _full_loss(module)
        options = dict(cls._selection() if selection is None else selection)
        options["callbacks"] = [*options.get("callbacks", []), *callbacks]
        trainer = run_fit(module=module, root_dir=out_dir / "runs", max_epochs=cls.max_epochs,
                          ckpt_path=ckpt_path, **options)
        return SuiteRun(trainer, module, before, _full_loss(module), out_dir)

    # -- the two runs every suite checks ------------------------------------------------------

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _ptrain_suite_available(cls):
        cls._plugin_name()  # fails when `plugin` is not set
        if cls.max_epochs < 2:
            pytest.fail("max_epochs must be at least 2: the resume tests resume after epoch 1.")
        reason = cls._unavailable()
        if reason is not None:
            pytest.skip(reason)

    @pytest.fixture(scope="class")
    @classmethod
    def full_run(cls, tmp_path_factory) -> SuiteRun:
        """A fit of ``max_epochs`` epochs with the plugin; its checkpoint after the first epoch
        is kept for :meth:`resumed_run`."""
        out = tmp_path_factory.mktemp(f"{cls.__name__}-full")
        probe = ResumeProbe(cls._plugin_name(), str(out))
        return cls._fit(out, callbacks=[probe, *cls._extra_callbacks(out)])

    @pytest.fixture(scope="class")
    @classmethod
    def resumed_run(cls, full_run: SuiteRun, tmp_path_factory) -> SuiteRun:
        """The same fit resumed (``ckpt_path``) from the checkpoint the full run wrote at the
        end of its first epoch."""
        checkpoint = full_run.out_dir / RESUME_CHECKPOINT
        assert checkpoint.exists(), (
            f"the fit wrote no checkpoint at the end of its first epoch "
            f"({full_run.trainer.last_checkpoint_path} was not there); the suites need the "
            f"checkpoint callback, which must not be blocked.")
        out = tmp_path_factory.mktemp(f"{cls.__name__}-resumed")
        probe = ResumeProbe(cls._plugin_name(), str(out), capture_loaded=True)
        return cls._fit(out, callbacks=[probe], ckpt_path=checkpoint)

    # -- tests every kind must pass -------------------------------------------------------------

    def test_fit_trains(self, full_run: SuiteRun):
        """A fit with the plugin lowers the training loss."""
        assert full_run.trainer.global_step > 0, "the fit took no optimizer step"
        assert math.isfinite(full_run.loss_after), f"the loss became {full_run.loss_after}"
        assert full_run.loss_after < LOSS_DROP * full_run.loss_before, (
            f"the training loss went from {full_run.loss_before:.4g} to "
            f"{full_run.loss_after:.4g} in {full_run.trainer.global_step} steps; a fit must "
            f"bring it below {LOSS_DROP:g} x where it started")

    def test_state_round_trips_through_a_checkpoint(self, full_run: SuiteRun,
                                                    resumed_run: SuiteRun):
        """What the plugin's ``state_dict`` put in the checkpoint is what its ``state_dict``
        gives back once a resumed run restored it (``load_state_dict``)."""
        saved = torch.load(full_run.out_dir / SAVED_STATE, weights_only=True)
        loaded = torch.load(resumed_run.out_dir / LOADED_STATE, weights_only=True)
        if not loaded["has_state_dict"]:
            assert not saved["present"], "the checkpoint holds state for a plugin without state_dict"
            return
        assert_same_state(saved["state"], loaded["state"], f"{self._plugin_name()} state")

    def test_resume_continues_exactly(self, full_run: SuiteRun, resumed_run: SuiteRun):
        """A run resumed after its first epoch ends with the weights of the unbroken run:
        model and optimizer state (SGD momentum) and the plugin's own state came back."""
        if not type(self).exact_resume:
            pytest.skip(f"{type(self).__name__}.exact_resume is False")
        assert resumed_run.trainer.global_step == full_run.trainer.global_step
        expected = full_run.module.state_dict()
        for key, value in resumed_run.module.state_dict().items():
            assert torch.equal(value.cpu(), expected[key].cpu()), (
                f"{key} differs between the resumed and the unbroken run "
                f"(max abs difference "
                f"{(value.cpu().double() - expected[key].cpu().double()).abs().max():.3g})")

    def test_state_is_kept_under_the_entry_point_name(self):
        """A stateful plugin class registers under its entry-point name also when it is given
        as an object from Python (its ``name`` attribute; else its class name in kebab case),
        so that a checkpoint written either way restores its state either way."""
        cls = type(self)
        if not isinstance(cls.plugin, str):
            pytest.skip("the plugin is given as a class: it has no entry-point name yet")
        target = import_target(Catalog.discover().get(cls.kind, cls.plugin))
        if not inspect.isclass(target) or not hasattr(getattr(target, "state_dict", None),
                                                      f"{PROJECT_NAME}_impl"):
            return  # registered by its entry-point name only, or nothing to restore
        assert object_name(target) == cls.plugin, (
            f"{target.__qualname__} objects register as {object_name(target)!r}, the entry point "
            f"as {cls.plugin!r}: its checkpointed state is lost when a run written one way is "
            f"resumed the other. Give the class `name = {cls.plugin!r}`.")

    def test_listed_by_ptrain_plugins(self):
        """``ptrain plugins`` lists the plugin under its kind."""
        if not isinstance(type(self).plugin, str):
            pytest.skip("the plugin is given as a class: install it and set `plugin` to its "
                        "entry-point name to check the listing")
        error, rows = _plugins_listing()
        assert not error, f"`ptrain plugins --json` failed: {error}"
        listed = [(row["kind"], row["name"]) for row in rows]
        assert (self.kind, self.plugin) in listed, (
            f"`ptrain plugins` does not list the {self.kind} {self.plugin!r}; it lists "
            f"{listed}")

    def test_tune_candidates_train(self, tmp_path):
        """Every candidate the plugin offers ``ptrain tune`` (its ``tune_candidates`` hook)
        trains a few measured steps on the suite's module, from a configuration without the
        plugin (the suite's ``options`` apply where a candidate selects the plugin; the
        candidate's own values win); one it marks unavailable here is passed over. A plugin that
        offers none passes (its answer was checked to be a list of candidates)."""
        from ptrain.loading import tune_candidates
        from ptrain.tuning import RunConfig
        from ptrain.tuning.trial import run_trial

        cls = type(self)
        if not isinstance(cls.plugin, str):
            pytest.skip("the plugin is given as a class: its candidates name installed plugins; "
                        "install it and set `plugin` to its entry-point name to check them")
        catalog = Catalog.discover()
        base = cls._selection(with_plugin=False) if cls.kind == "callback" else \
            dict(cls.trainer_options)
        plugin_options = base.pop("plugin_options", {})
        user = Trainer(default_root_dir=str(tmp_path / "made"), plugin_options=plugin_options,
                       catalog=catalog, **base)
        offered = tune_candidates(import_target(catalog.get(cls.kind, cls.plugin)), cls.plugin,
                                  user)
        if not offered:  # a plugin need not offer any; what it answered was a valid list
            return
        runnable = [c for c in offered if c.unavailable is None]
        if not runnable:
            pytest.skip(f"{cls.plugin!r} offers ptrain tune no candidate that can run here: "
                        f"{offered[0].unavailable}")
        for candidate in runnable:
            config = RunConfig(base, plugin_options).with_candidates((candidate,))
            selected = (cls.plugin in config.trainer.get("callbacks", []) if cls.kind == "callback"
                        else config.trainer.get(cls.kind) == cls.plugin)
            if cls.options and selected:  # what the plugin needs on the suite's module
                merged = {**cls.options, **config.plugin_options.get(cls.plugin, {})}
                config = RunConfig(config.trainer, {**config.plugin_options, cls.plugin: merged})
            measured = run_trial(config, lambda: (cls._make_module(), None), seed=0, warmup=1,
                                 steps=2, catalog=catalog)
            assert measured.error is None, (
                f"ptrain tune's candidate {candidate.name!r} of {cls.plugin!r} failed to train: "
                f"{measured.error}")
            assert measured.samples_per_s > 0 and len(measured.losses) >= 3, measured


class AcceleratorSuite(PluginSuite):
    """For an accelerator: its device is a ``torch.device``; the batches the model step sees
    and the parameters are on it; a fit trains; its checkpoint resumes on the host's CPU with
    the trained weights; plus :class:`PluginSuite`'s tests."""

    kind = "accelerator"

    @classmethod
    def _extra_callbacks(cls, out_dir: Path) -> list[Any]:
        return [StepProbe()]

    @staticmethod
    def _probe(run: SuiteRun) -> StepProbe:
        return run.trainer.plugins[StepProbe.name]

    def test_device_is_a_torch_device(self, full_run: SuiteRun):
        assert isinstance(full_run.trainer.device, torch.device), (
            f"trainer.device is {full_run.trainer.device!r}")

    def test_batches_and_parameters_are_on_the_device(self, full_run: SuiteRun):
        device, probe = full_run.trainer.device, self._probe(full_run)
        assert probe.batch_devices, "no tensor reached the model step"
        wrong = sorted(d for d in probe.batch_devices if not _same_device(d, device))
        assert not wrong, f"the model step saw batch tensors on {wrong}, not on {device}"
        wrong = sorted(d for d in probe.param_devices if not _same_device(d, device))
        assert not wrong, f"parameters were on {wrong} during training, not on {device}"

    def test_checkpoint_resumes_on_the_host(self, full_run: SuiteRun, tmp_path_factory):
        """The checkpoint written on the device loads onto the CPU (weights only) with the
        trained weights, and a CPU run resumes from it."""
        path = full_run.trainer.last_checkpoint_path
        assert Path(path).is_file(), f"no checkpoint file at {path}"
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        trained = {k: v.detach().cpu() for k, v in full_run.module.state_dict().items()}
        for key, value in trained.items():
            assert torch.equal(checkpoint["model"][key], value), f"checkpoint {key} != trained"
        out = tmp_path_factory.mktemp(f"{type(self).__name__}-host")
        selection = {k: v for k, v in self._selection().items()
                     if k not in ("accelerator", "plugin_options")}
        host = self._fit(out, callbacks=[], ckpt_path=Path(path),
                         selection={**selection, "accelerator": "cpu"})
        for key, value in host.module.state_dict().items():
            assert torch.equal(value, trained[key]), f"{key} changed when resumed on the CPU"


class PrecisionSuite(PluginSuite):
    """For a precision: backward gives every trainable parameter a finite gradient (a loss
    scaler may skip steps whose gradients overflowed while it finds its scale, never the last);
    a fit trains; parameters keep the dtype its ``precision_policy`` promises; plus
    :class:`PluginSuite`'s tests. Runs on the CPU unless ``trainer_options`` says otherwise."""

    kind = "precision"

    @classmethod
    def _extra_callbacks(cls, out_dir: Path) -> list[Any]:
        return [StepProbe()]

    def test_backward_gives_finite_gradients(self, full_run: SuiteRun):
        probe: StepProbe = full_run.trainer.plugins[StepProbe.name]
        assert probe.missing_grads, "no optimizer step happened"
        for step, missing in enumerate(probe.missing_grads):
            assert not missing, f"step {step}: no gradient for trainable parameters {missing}"
        finite = probe.finite_per_step()
        policy = full_run.trainer.precision_policy
        steps = range(len(finite)) if not policy.loss_scaling else [len(finite) - 1]
        for step in steps:
            bad = [n for n, ok in zip(probe.names, finite[step]) if not ok]
            assert not bad, f"step {step}: non-finite gradients for {bad}"

    def test_parameters_have_the_promised_dtype(self, full_run: SuiteRun):
        policy = full_run.trainer.precision_policy
        assert isinstance(policy, PrecisionPolicy), f"precision_policy returned {policy!r}"
        probe: StepProbe = full_run.trainer.plugins[StepProbe.name]
        assert probe.param_dtypes == {policy.param_dtype}, (
            f"trainable parameters were {sorted(map(str, probe.param_dtypes))} during training; "
            f"the policy promises {policy.param_dtype}")
        after = {p.dtype for p in full_run.module.parameters() if p.is_floating_point()}
        assert after == {policy.param_dtype}, (
            f"after the fit the parameters are {sorted(map(str, after))}; the policy promises "
            f"{policy.param_dtype}")


class StrategySuite(PluginSuite):
    """For a strategy: a fit trains; its processes get distinct ranks; a checkpoint saved and
    resumed round-trips the model and optimizer state exactly; plus :class:`PluginSuite`'s
    tests. A strategy built on :class:`ptrain.distributed.ProcessGroupStrategy` runs with
    ``devices`` (default 2) gloo processes on the CPU; set ``devices`` for another count."""

    kind = "strategy"
    devices: ClassVar[int | None] = None

    @classmethod
    def process_count(cls) -> int:
        """How many processes the suite's runs use."""
        if cls.devices is not None:
            return cls.devices
        return 2 if is_multi_process(cls.plugin) else 1

    @classmethod
    def _selection(cls, with_plugin: bool = True) -> dict[str, Any]:
        options = super()._selection(with_plugin)
        options.setdefault("devices", cls.process_count())
        return options

    def test_processes_get_distinct_ranks(self, full_run: SuiteRun):
        count = self.process_count()
        records = [json.loads(p.read_text()) for p in sorted(full_run.out_dir.glob("rank*.json"))]
        assert sorted(r["global_rank"] for r in records) == list(range(count)), records
        assert {r["world_size"] for r in records} == {count}, records


def is_multi_process(plugin: str | type | None) -> bool:
    """Whether strategy ``plugin`` (a name or class) is built on
    :class:`ptrain.distributed.ProcessGroupStrategy` (imports it; ``False`` if it can't be)."""
    if plugin is None:
        return False
    try:
        target = (import_target(Catalog.discover().get("strategy", plugin))
                  if isinstance(plugin, str) else plugin)
    except PluginError:
        return False
    from ptrain.distributed import ProcessGroupStrategy

    return inspect.isclass(target) and issubclass(target, ProcessGroupStrategy)


class CallbackSuite(PluginSuite):
    """For a callback: a fit with it completes and trains; its state round-trips through a
    checkpoint resume; it leaves the hook calls of the other plugins as they were (see
    :meth:`test_other_plugins_hooks_unchanged`); plus :class:`PluginSuite`'s tests."""

    kind = "callback"

    @classmethod
    def _extra_callbacks(cls, out_dir: Path) -> list[Any]:
        return [HookRecorder(save_to=out_dir / _HOOK_RECORDS)]

    @pytest.fixture(scope="class")
    @classmethod
    def baseline_run(cls, tmp_path_factory) -> SuiteRun:
        """The same fit without the callback (blocked, if it is on by default)."""
        out = tmp_path_factory.mktemp(f"{cls.__name__}-baseline")
        probe = ResumeProbe(cls._plugin_name(), str(out))
        return cls._fit(out, callbacks=[probe, *cls._extra_callbacks(out)],
                        selection=cls._selection(with_plugin=False))

    @staticmethod
    def _recorders(run: SuiteRun) -> list[HookRecorder]:
        """The hook calls of the run's fit, one recorder per process: the run's own
        :class:`HookRecorder` when the fit ran in this process, else what each worker
        process of a multi-process strategy saved (rank 0 first)."""
        recorder: HookRecorder = run.trainer.plugins[HookRecorder.name]
        if recorder.calls_of("setup_device"):
            return [recorder]
        saved = sorted((run.out_dir / _HOOK_RECORDS).glob("hooks-rank*.json"),
                       key=lambda p: int(p.stem.removeprefix("hooks-rank")))
        assert saved, (f"the fit ran in worker processes, and none of them saved its hook "
                       f"calls to {run.out_dir / _HOOK_RECORDS} (did a worker fail to start "
                       f"or end?)")
        return [HookRecorder.load(path) for path in saved]

    def test_fit_completes(self, full_run: SuiteRun):
        """Every process set up for ``fit`` once and tore down without an error."""
        for recorder in self._recorders(full_run):
            where = _process(recorder)
            stages = [c.kwargs["stage"] for c in recorder.calls_of("setup")]
            assert stages == ["fit"], f"{where}: setup ran for {stages}"
            teardowns = recorder.calls_of("teardown")
            assert len(teardowns) == 1 and teardowns[0].error is None, (
                f"{where}: teardown {[c.error for c in teardowns]}")

    def test_other_plugins_hooks_unchanged(self, full_run: SuiteRun, baseline_run: SuiteRun):
        """Compared with a run without it, the callback removes no hook from the run, and in
        each call of a hook the same implementations of the other plugins run, in the same
        order (it does not take over a firstresult hook from them, nor stop them in a
        wrapper). It may add hook calls (a checkpoint callback adds ``save_checkpoint``) and
        end the run earlier; ``state_dict``/``load_state_dict`` are compared as sets of
        plugins, since the core calls them plugin by plugin."""
        base, test = self._recorders(baseline_run), self._recorders(full_run)
        assert len(base) == len(test), (
            f"{len(base)} processes recorded without the callback, {len(test)} with it")
        for base_calls, test_calls in zip(base, test):
            self._same_other_implementations(base_calls, test_calls)

    def _same_other_implementations(self, base: HookRecorder, test: HookRecorder) -> None:
        own = {self._plugin_name(), HookRecorder.name, ResumeProbe.name}
        where = _process(test)
        missing = sorted(set(base.names()) - set(test.names()))
        assert not missing, f"{where}: with the callback these hooks never fire: {missing}"

        def others(call: HookCall) -> list[str]:
            return [p for p in call.plugins if p not in own]

        for hook in sorted(set(base.names())):
            before, after = base.calls_of(hook), test.calls_of(hook)
            if hook in _PER_PLUGIN_HOOKS:
                lost = ({p for c in before for p in others(c)}
                        - {p for c in after for p in others(c)})
                assert not lost, f"{where}: {hook} is no longer called for {sorted(lost)}"
                continue
            for i, (b, a) in enumerate(zip(before, after)):
                assert others(a) == others(b), (
                    f"{where}: call {i} of {hook}: the other plugins' implementations that ran "
                    f"changed from {others(b)} to {others(a)} (all that ran: {a.plugins})")


def _process(recorder: HookRecorder) -> str:
    ranks = {call.rank for call in recorder.calls} - {None}
    return f"rank {min(ranks)}" if ranks else "the process"


__all__ = ["AcceleratorSuite", "CallbackSuite", "PluginSuite", "PrecisionSuite",
           "StrategySuite", "SuiteRun", "assert_same_state", "is_multi_process"]
