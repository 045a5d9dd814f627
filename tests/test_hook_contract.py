"""The hook specification as a contract: documented, tested, and each hook takes effect when a
plugin implements it. Plugins here are real objects registered through ``Trainer``."""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import ptrain
from ptrain import hookimpl, hookspecs
from ptrain.catalog import Catalog, PluginInfo
from ptrain.data import rebuild_dataloader
from ptrain.errors import PluginError
from ptrain.hook_methods import Callback
from ptrain.loading import check_available, create_plugin_manager, declare_options, register
from tests.conftest import REPO, TinyRegressor

SPEC_MARK = f"{hookspecs.PROJECT_NAME}_spec"
HOOKS = sorted(n for n, f in vars(hookspecs).items()
               if inspect.isfunction(f) and hasattr(f, SPEC_MARK))
DECLARATION_HOOKS = {"add_options", "check_available"}


# -- meta: every hook documented with its exact signature, and implemented by some test -----------


def test_hook_reference_is_generated_from_the_spec():
    result = subprocess.run([sys.executable, "scripts/gen_hook_docs.py", "--check"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_is_documented_with_its_signature(name):
    function = getattr(hookspecs, name)
    doc = (REPO / "docs" / "hooks.md").read_text()
    assert f"def {name}{inspect.signature(function)}".replace("'", "") in doc
    text = inspect.getdoc(function)
    for part in ("Fires:", "Result:", "Implemented by"):
        assert part in text, f"{name}'s docstring lacks {part!r}"
    params = inspect.signature(function).parameters
    assert ("trainer" in params) != (name in DECLARATION_HOOKS)


def _hookimpls_in_tests() -> set[str]:
    names = set()
    for path in (REPO / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and any(
                    "hookimpl" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def test_every_hook_is_implemented_by_a_test_plugin():
    missing = set(HOOKS) - _hookimpls_in_tests()
    assert not missing, f"hooks no test implements: {sorted(missing)}"


# -- each hook takes effect ---------------------------------------------------------------------


class CountingWrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, *args):
        self.calls += 1
        return self.inner(*args)


class WrappingStrategy:
    name = "wrapping"

    @hookimpl
    def wrap_model(self, trainer, model):
        return CountingWrapper(model.to(trainer.device))


def test_wrap_model_result_is_what_the_loop_calls(make_trainer):
    trainer = make_trainer(strategy=WrappingStrategy(), max_epochs=1)
    trainer.fit(TinyRegressor(n=32, batch_size=8, val_n=16))
    assert isinstance(trainer.model, CountingWrapper)
    assert trainer.model.calls == 2 + 4 + 2  # 2 sanity-check, 4 training, 2 validation batches


class ReplacingOptimizer:
    name = "replacer"

    @hookimpl
    def wrap_optimizer(self, optimizer):
        replacement = torch.optim.SGD(
            [p for g in optimizer.param_groups for p in g["params"]], lr=0.5)
        self.replacement = replacement
        return replacement


def test_wrap_optimizer_replacement_is_used_and_schedulers_follow(make_trainer):
    plugin = ReplacingOptimizer()
    trainer = make_trainer(callbacks=["no:progress-bar", plugin], max_epochs=2)
    trainer.fit(TinyRegressor(scheduler={"gamma": 0.5, "interval": "epoch"}))
    assert trainer.optimizers == [plugin.replacement]
    assert trainer.lr_schedulers[0]["scheduler"].optimizer is plugin.replacement
    assert plugin.replacement.param_groups[0]["lr"] == pytest.approx(0.5 * 0.5 ** 2)


class BatchSizeWrapper:
    """Two wrappers compose: each rebuilds the loader its inner implementations returned."""

    def __init__(self, name, factor):
        self.name, self.factor = name, factor

    @hookimpl(wrapper=True)
    def prepare_dataloader(self, dataloader, stage):
        loader = yield
        if stage != "train":
            return loader
        return rebuild_dataloader(loader, batch_size=loader.batch_size * self.factor)


def test_prepare_dataloader_wrappers_compose(make_trainer):
    trainer = make_trainer(callbacks=["no:progress-bar", BatchSizeWrapper("a", 2),
                                      BatchSizeWrapper("b", 2)], max_epochs=1)
    trainer.fit(TinyRegressor(n=64, batch_size=2))
    assert trainer.train_dataloader.batch_size == 8
    assert trainer.global_step == 8


class InlineLauncher:
    name = "inline-launcher"
    launches = 0

    @hookimpl
    def launch(self, function):
        self.launches += 1
        result = function()
        return result

    @hookimpl
    def setup(self, trainer):
        self.setups = getattr(self, "setups", 0) + 1


def test_launch_result_stops_the_core_running_the_stage_again(make_trainer):
    plugin = InlineLauncher()
    trainer = make_trainer(strategy=plugin, max_epochs=1)
    trainer.fit(TinyRegressor(n=16))
    assert plugin.launches == 1 and plugin.setups == 1


class HalfPrecisionPolicy:
    name = "policy"

    @hookimpl
    def precision_policy(self):
        return ptrain.PrecisionPolicy(torch.float32, torch.bfloat16, torch.float32)


def test_precision_policy_reaches_the_trainer(make_trainer):
    trainer = make_trainer(precision=HalfPrecisionPolicy(), max_epochs=1)
    trainer.fit(TinyRegressor(n=16))
    assert trainer.precision_policy.compute_dtype == torch.bfloat16
    assert trainer.precision_policy.is_mixed


class DoublingReducer:
    name = "doubling"

    @hookimpl
    def reduce_metrics(self, metrics, op):
        return {k: v * 2 if op == "mean" else v for k, v in metrics.items()}


class ValLossRecorder:
    name = "val-recorder"

    @hookimpl
    def log_metrics(self, metrics):
        if "val_loss" in metrics:
            self.logged = metrics["val_loss"]


def test_reduce_metrics_result_is_what_callbacks_and_loggers_see(make_trainer):
    recorder = ValLossRecorder()
    plain = make_trainer(max_epochs=1)
    torch.manual_seed(0)
    plain.fit(TinyRegressor(n=16))
    doubled = make_trainer(strategy=DoublingReducer(), callbacks=["no:progress-bar", recorder],
                           max_epochs=1)
    torch.manual_seed(0)
    doubled.fit(TinyRegressor(n=16))
    expected = 2 * float(plain.callback_metrics["val_loss"])
    assert float(doubled.callback_metrics["val_loss"]) == pytest.approx(expected)
    assert recorder.logged == pytest.approx(expected)


class DirectoryCheckpoints:
    """A strategy that stores a checkpoint as a folder of two files."""

    name = "dir-ckpt"

    @hookimpl
    def save_checkpoint(self, checkpoint, path):
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint["model"], folder / "model.pt")
        torch.save({k: v for k, v in checkpoint.items() if k != "model"}, folder / "rest.pt")
        return True

    @hookimpl
    def load_checkpoint(self, path):
        folder = Path(path)
        rest = torch.load(folder / "rest.pt", weights_only=True)
        return {**rest, "model": torch.load(folder / "model.pt", weights_only=True)}


def test_save_and_load_checkpoint_can_be_taken_over(make_trainer):
    first = make_trainer(strategy=DirectoryCheckpoints(), max_epochs=1)
    first.fit(TinyRegressor(n=16))
    assert (first.last_checkpoint_path / "model.pt").is_file()
    second = make_trainer(strategy=DirectoryCheckpoints(), max_epochs=2)
    module = TinyRegressor(n=16)
    second.fit(module, ckpt_path="last")
    assert second.log_dir == first.log_dir
    assert second.global_step == 4


class OrderProbe:
    """Backward is taken by the most recently registered implementation: callbacks first."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    @hookimpl
    def backward(self, loss):
        self.log.append(self.name)
        if self.name == "callback":
            loss.backward()
            return True
        return None


def test_registration_order_callbacks_then_strategy_then_precision(make_trainer):
    log: list[str] = []
    trainer = make_trainer(precision=OrderProbe("precision", log),
                           strategy=OrderProbe("strategy", log),
                           callbacks=["no:progress-bar", OrderProbe("callback", log)],
                           max_steps=1)
    trainer.fit(TinyRegressor(n=8))
    assert log == ["callback"]
    log.clear()
    trainer = make_trainer(precision=OrderProbe("precision", log),
                           strategy=OrderProbe("strategy", log), max_steps=1)
    trainer.fit(TinyRegressor(n=8))
    assert log == ["strategy", "precision"]


class GradientInspector:
    name = "grad-inspector"

    @hookimpl
    def on_before_optimizer_step(self, optimizer):
        self.seen = [p.grad is not None for g in optimizer.param_groups for p in g["params"]]


def test_on_before_optimizer_step_sees_complete_gradients(make_trainer):
    plugin = GradientInspector()
    make_trainer(callbacks=["no:progress-bar", plugin], max_steps=1).fit(TinyRegressor(n=8))
    assert plugin.seen and all(plugin.seen)


class AutocastLikeWrapper:
    """A model_step wrapper: runs around every train and validation step."""

    name = "around-step"

    def __init__(self):
        self.stages: list[str] = []
        self.grad_enabled: list[bool] = []

    @hookimpl(wrapper=True)
    def model_step(self, stage):
        self.stages.append(stage)
        self.grad_enabled.append(torch.is_grad_enabled())
        return (yield)


def test_model_step_wrapper_sees_every_step(make_trainer):
    plugin = AutocastLikeWrapper()
    make_trainer(callbacks=["no:progress-bar", plugin], max_epochs=1).fit(
        TinyRegressor(n=16, batch_size=8, val_n=16))
    # the sanity check's validation batches come first, like every validation without autograd
    assert plugin.stages == ["validate", "validate", "train", "train", "validate", "validate"]
    assert plugin.grad_enabled == [False, False, True, True, False, False]


class SkippingStep:
    """An optimizer_step that skips every step (as a scaler does on overflow)."""

    name = "skipper"

    @hookimpl
    def optimizer_step(self, optimizer):
        return True


def test_optimizer_step_taken_over_leaves_parameters_unchanged(make_trainer):
    module = TinyRegressor(n=16)
    before = [p.detach().clone() for p in module.parameters()]
    trainer = make_trainer(precision=SkippingStep(), max_epochs=1)
    trainer.fit(module)
    assert trainer.global_step == 2  # a skipped step still counts as a step taken
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


class ZeroClip:
    name = "zero-clip"

    @hookimpl
    def clip_gradients(self, trainer, optimizer):
        self.algorithm = trainer.gradient_clip_algorithm
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad.zero_()
        return True


def test_clip_gradients_fires_only_when_clipping_is_on(make_trainer):
    module = TinyRegressor(n=16)
    before = [p.detach().clone() for p in module.parameters()]
    plugin = ZeroClip()
    make_trainer(strategy=plugin, max_epochs=1).fit(module)
    assert not hasattr(plugin, "algorithm")
    assert not all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
    module = TinyRegressor(n=16)
    before = [p.detach().clone() for p in module.parameters()]
    make_trainer(strategy=plugin, max_epochs=1, gradient_clip_val=1.0,
                 gradient_clip_algorithm="value").fit(module)
    assert plugin.algorithm == "value"
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


class ClipsSomeSteps:
    """Decides itself, every step, whether to clip: here never (it leaves the step alone)."""

    name = "clips-some-steps"
    clips_every_step = True

    def __init__(self):
        self.calls = 0

    @hookimpl
    def clip_gradients(self):
        self.calls += 1
        return None  # nothing to do this step: the next implementation decides


def test_a_clips_every_step_plugin_may_decline_without_clip_val(make_trainer):
    """With no gradient_clip_val, the default has nothing to clip: it used to call
    clip_grad_norm_(params, None) and fail with a TypeError blamed on 'loop-defaults'."""
    module, plain = TinyRegressor(n=16), TinyRegressor(n=16)
    plain.load_state_dict(module.state_dict())
    plugin = ClipsSomeSteps()
    trainer = make_trainer(callbacks=["no:progress-bar", plugin], max_epochs=1)
    trainer.fit(module)
    assert plugin.calls == trainer.global_step > 0
    make_trainer(max_epochs=1).fit(plain)  # the same steps, unclipped
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), plain.parameters()))


class LosesTheModel:
    name = "loses-the-model"

    @hookimpl(wrapper=True)
    def wrap_model(self):
        yield
        return "compiled"  # meant: the compiled model


def test_a_wrap_model_result_that_is_no_module_names_the_implementations(make_trainer):
    """It failed at the sanity check with "'str' object has no attribute 'modules'", from the
    core, naming no plugin."""
    trainer = make_trainer(callbacks=["no:progress-bar", LosesTheModel()], max_epochs=1)
    with pytest.raises(PluginError, match=r"wrap_model returned str 'compiled', not a "
                                          r"torch.nn.Module.*: 'loses-the-model'"):
        trainer.fit(TinyRegressor(n=16))


class RankSettingDevice:
    """A strategy wraps setup_device: ranks before the accelerator, the device after."""

    name = "rank-setter"

    @hookimpl(wrapper=True)
    def setup_device(self, trainer):
        trainer.local_rank = 0
        self.seen_before = trainer.device
        device = yield
        self.seen_after = device
        return device


class ZeroingTransfer:
    name = "zeroing-transfer"

    @hookimpl
    def setup_device(self):
        return torch.device("cpu")

    @hookimpl
    def transfer_batch(self, trainer, batch):
        x, y = batch
        return x.to(trainer.device) * 0, y.to(trainer.device)


def test_setup_device_wrapper_and_transfer_batch(make_trainer):
    strategy = RankSettingDevice()
    module = TinyRegressor(n=16)
    trainer = make_trainer(strategy=strategy, accelerator=ZeroingTransfer(), max_epochs=1)
    weight_before = module.net[1].weight.detach().clone()
    trainer.fit(module)
    assert strategy.seen_after == torch.device("cpu") == trainer.device
    # inputs were zeroed by the accelerator's transfer: the weight gets no gradient
    assert torch.equal(module.net[1].weight, weight_before)


class Lifecycle:
    name = "lifecycle"

    def __init__(self):
        self.events: list[str] = []

    @hookimpl
    def on_epoch_start(self, trainer):
        self.events.append(f"start{trainer.current_epoch}")

    @hookimpl
    def on_validation_end(self, trainer):
        self.events.append(f"val{trainer.current_epoch}")
        if trainer.current_epoch == 1:
            raise RuntimeError("boom")

    @hookimpl
    def teardown(self, trainer, stage):
        self.events.append(f"teardown-{stage}-{type(trainer.exception).__name__}")


def test_teardown_fires_after_an_error_with_the_exception(make_trainer):
    plugin = Lifecycle()
    with pytest.raises(RuntimeError, match="boom"):
        make_trainer(callbacks=["no:progress-bar", plugin], max_epochs=3).fit(TinyRegressor())
    assert plugin.events == ["start0", "val0", "start1", "val1", "teardown-fit-RuntimeError"]


class ReplacingError:
    """Raises an error of its own in place of the stage's, as a strategy reporting the first
    failing rank's error does."""

    name = "replacing-error"

    def __init__(self):
        self.seen: list[BaseException] = []
        self.in_teardown: BaseException | None = None

    @hookimpl
    def on_validation_end(self, trainer):
        raise RuntimeError("the stage's own error")

    @hookimpl
    def report_error(self, trainer, exception):
        self.seen.append(exception)
        return ptrain.ConfigError("the error that explains it")

    @hookimpl
    def teardown(self, trainer):
        self.in_teardown = trainer.exception


def test_report_error_replaces_the_error_a_stage_raises(make_trainer):
    plugin = ReplacingError()
    with pytest.raises(ptrain.ConfigError, match="the error that explains it") as info:
        make_trainer(callbacks=["no:progress-bar", plugin], max_epochs=2).fit(TinyRegressor())
    assert [str(e) for e in plugin.seen] == ["the stage's own error"]
    assert plugin.in_teardown is info.value  # teardown sees the error that is raised
    assert info.value.__suppress_context__  # not chained to the one it replaced


class Float64Layers:
    """Layers made in configure_model (or init_module) get float64 parameters."""

    name = "float64-layers"

    def __init__(self):
        self.entered = 0

    @hookimpl
    def module_init_context(self, empty_init):
        @contextlib.contextmanager
        def float64():
            self.entered += 1
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                yield
            finally:
                torch.set_default_dtype(previous)

        return float64()


class BuiltInConfigureModel(TinyRegressor):
    def __init__(self):
        super().__init__()
        self.configured = 0

    def configure_model(self):
        self.configured += 1
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x.double()), y.double())

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x.double()), y.double()))


def test_configure_model_runs_once_inside_every_init_context(make_trainer):
    plugin, module = Float64Layers(), BuiltInConfigureModel()
    trainer = make_trainer(callbacks=["no:progress-bar", plugin], max_epochs=1)
    trainer.fit(module)
    trainer.validate(module)
    assert module.configured == 1 and plugin.entered == 1  # the second stage found it built
    assert module.net.weight.dtype == torch.float64
    with trainer.init_module():
        extra = nn.Linear(2, 2)
    assert extra.weight.dtype == torch.float64 and plugin.entered == 2


class PlanEditor:
    """Takes the output layer out of every plan it sees. It writes what it was given, and which
    of the model's weights a plan split, to ``<folder>/plans.json`` (under model-parallel the
    stage runs in a process of its own, even for one device)."""

    name = "plan-editor"

    def __init__(self, folder: Path):
        self.folder = folder
        self.seen = []

    @hookimpl
    def modify_parallel_plan(self, module, mesh, plan):
        self.seen.append([type(module).__name__, list(mesh.mesh_dim_names), sorted(plan)])
        plan.pop("output", None)

    @hookimpl
    def setup(self, trainer):
        module = trainer.module
        split = {name: "tp" in getattr(parameter, "device_mesh", None).mesh_dim_names
                 for name, parameter in module.named_parameters()
                 if name in ("tok_embeddings.weight", "output.weight")}
        (self.folder / "plans.json").write_text(json.dumps({"seen": self.seen, "split": split}))


def test_modify_parallel_plan_changes_the_plan_torch_applies(make_trainer, tmp_path):
    """The worked decoder applies its plan with self.parallelize on one process's mesh: the
    plugin sees each call, and what it removes from the plan is left unsplit."""
    from examples.decoder import Decoder

    module = Decoder(samples=16, batch_size=8)
    make_trainer(strategy="model-parallel", callbacks=["no:progress-bar", PlanEditor(tmp_path)],
                 max_epochs=1).fit(module)
    record = json.loads((tmp_path / "plans.json").read_text())
    assert record["seen"] == [["Decoder", ["tp"], ["output", "tok_embeddings"]]] + \
        [["Block", ["tp"], sorted(module.block_plan())]] * 2
    assert record["split"] == {"tok_embeddings.weight": True, "output.weight": False}


class OnlineProbe:
    """Changes the model after each step and logs a value there; records what the validation
    and the logger saw."""

    name = "online-probe"

    def __init__(self):
        self.events, self.bias_validated, self.published = [], [], {}

    @hookimpl
    def on_train_step_end(self, trainer, batch_idx, loss):
        self.events.append(f"step_end:{batch_idx}:{trainer.global_step}")
        with torch.no_grad():
            trainer.module.net[1].bias.fill_(float(batch_idx + 100))
        trainer.module.log("probe_batch", float(batch_idx))

    @hookimpl
    def on_loop_start(self, trainer, loop):
        if loop == "validate" and not trainer.sanity_checking:
            self.events.append("validate")
            self.bias_validated.append(float(trainer.module.net[1].bias))

    @hookimpl
    def on_train_batch_end(self, batch_idx):
        self.events.append(f"batch_end:{batch_idx}")

    @hookimpl
    def log_metrics(self, metrics, step):
        if "probe_batch" in metrics:
            self.published[step] = metrics["probe_batch"]


def test_on_train_step_end_comes_before_what_the_batch_triggers(make_trainer):
    """After the step (global_step counts it), before the step's values are published and
    before the validation due after the batch, which sees what the hook did to the model."""
    probe = OnlineProbe()
    make_trainer(callbacks=["no:progress-bar", probe], max_epochs=1, log_every_n_steps=1,
                 num_sanity_val_steps=0).fit(TinyRegressor(n=16))
    assert probe.events == ["step_end:0:1", "batch_end:0", "step_end:1:2", "validate",
                            "batch_end:1"]
    assert probe.bias_validated == [101.0]
    assert probe.published == {1: 0.0, 2: 1.0}  # each step's own value, at its own step


class Counter:
    name = "counter"

    def __init__(self):
        self.count = 0
        self.restored = None

    @hookimpl
    def on_train_batch_end(self):
        self.count += 1

    @hookimpl
    def state_dict(self):
        return {"count": self.count}

    @hookimpl
    def load_state_dict(self, state):
        self.restored = state["count"]
        self.count = state["count"]


def test_plugin_state_round_trips_through_a_checkpoint(make_trainer):
    first = Counter()
    make_trainer(callbacks=["no:progress-bar", first], max_epochs=1).fit(TinyRegressor(n=16))
    second = Counter()
    make_trainer(callbacks=["no:progress-bar", second], max_epochs=2).fit(
        TinyRegressor(n=16), ckpt_path="last")
    assert second.restored == 2 and second.count == 4


# -- loading rules ------------------------------------------------------------------------------


class Typo:
    name = "typo"

    @hookimpl
    def on_epoch_ned(self, trainer):
        pass


def test_implementing_a_hook_that_does_not_exist_is_an_error():
    with pytest.raises(PluginError, match="on_epoch_ned.*not a ptrain hook.*on_epoch_end"):
        ptrain.Trainer(callbacks=[Typo()])


class SpecnameTypo:
    name = "specname-typo"

    @hookimpl(specname="on_epoch_ned")
    def _at_the_end(self, trainer):
        pass


class PrivateHook:
    name = "private-hook"

    @hookimpl
    def setup(self):
        pass

    @hookimpl
    def _on_epoch_end(self, trainer):
        pass


def test_a_marked_private_method_must_name_a_hook_too():
    """A private method implements a hook through ``specname``; a typo there, or a marked
    private method without one, was registered under a hook no one calls and said nothing."""
    with pytest.raises(PluginError, match=r"'on_epoch_ned' \(specname of '_at_the_end'\), "
                                          r"which is not a ptrain hook.*on_epoch_end"):
        ptrain.Trainer(callbacks=[SpecnameTypo()])
    with pytest.raises(PluginError, match=r"'_on_epoch_end', which is not a ptrain hook.*"
                                          r"'on_epoch_end'"):
        ptrain.Trainer(callbacks=[PrivateHook()])


class UnmarkedHook:
    name = "unmarked-hook"

    @hookimpl
    def setup(self, trainer, stage):
        pass

    def on_epoch_end(self, trainer):  # the mark forgotten: pluggy passes it over
        pass


class HelperNamedLikeAHook(UnmarkedHook):
    name = "helper-named-like-a-hook"
    not_ptrain_hooks = ("on_epoch_end",)


class MarkedLightningCallback(Callback):
    """Lightning's methods (``setup``, ``state_dict``, ...) come from the base, unmarked on
    purpose."""
    name = "marked-lightning-callback"

    @hookimpl
    def on_epoch_end(self, trainer):
        pass


class OnlyUnmarked:
    name = "only-unmarked"

    def on_loop_start(self, trainer, loop):
        pass


def _named_like_a_hook(record) -> list[str]:
    return [str(w.message) for w in record if "named like" in str(w.message)]


def test_a_method_named_like_a_hook_without_the_mark_is_said():
    """pluggy registers only marked methods: an unmarked ``on_epoch_end`` beside a marked
    ``setup`` was never called, and nothing said so."""
    with pytest.warns(UserWarning, match=r"'unmarked-hook'.*UnmarkedHook\.on_epoch_end, named "
                                         r"like a ptrain hook, is not marked @ptrain\.hookimpl, "
                                         r"so ptrain never calls it.*rename it.*"
                                         r"not_ptrain_hooks") as record:
        ptrain.Trainer(callbacks=[UnmarkedHook()])
    assert len(_named_like_a_hook(record)) == 1
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ptrain.Trainer(callbacks=[HelperNamedLikeAHook(), MarkedLightningCallback()])
    assert _named_like_a_hook(record) == []
    with pytest.raises(PluginError, match=r"'only-unmarked'.*implements no ptrain hook.*"
                                          r"OnlyUnmarked\.on_loop_start, named like a ptrain "
                                          r"hook, is not marked: put @ptrain\.hookimpl above it"):
        ptrain.Trainer(callbacks=[OnlyUnmarked()])


class WrongArgs:
    name = "wrong-args"

    @hookimpl
    def on_epoch_end(self, trainer, epoch):
        pass


def test_an_argument_the_spec_does_not_have_is_an_error():
    with pytest.raises(PluginError, match="wrong-args"):
        ptrain.Trainer(callbacks=[WrongArgs()])


class Optioned:
    def __init__(self, size: int = 2, label: str = "x"):
        self.size, self.label = size, label

    @staticmethod
    @hookimpl
    def add_options(options):
        options.add("size", int, default=2, help="a size")
        options.add("label", str, default="x", choices=("x", "y"))

    @staticmethod
    @hookimpl
    def check_available():
        return None


class Unavailable:
    @staticmethod
    @hookimpl
    def check_available():
        return "needs hardware this machine lacks"


class InstanceMethodOptions:
    @hookimpl
    def add_options(self, options):
        pass


def _catalog(**targets: str) -> Catalog:
    base = Catalog.discover().infos
    extra = [PluginInfo("callback", name, target, "test-dist", "0") for name, target in
             targets.items()]
    return Catalog(base + extra)


def test_options_declared_through_add_options_reach_the_plugin():
    group = declare_options(Optioned, "optioned")
    assert [o.flag for o in group.options.values()] == ["--optioned-size", "--optioned-label"]
    catalog = _catalog(optioned="tests.test_hook_contract:Optioned")
    trainer = ptrain.Trainer(callbacks=["optioned"], catalog=catalog,
                             plugin_options={"optioned": {"size": "5", "label": "y"}})
    assert trainer.plugins["optioned"].size == 5
    assert trainer.config["plugins"]["optioned"] == {"size": 5, "label": "y"}
    with pytest.raises(ptrain.ConfigError, match="valid choices: x, y"):
        ptrain.Trainer(callbacks=["optioned"], catalog=catalog,
                       plugin_options={"optioned": {"label": "z"}})
    with pytest.raises(ptrain.ConfigError, match="Did you mean 'size'"):
        ptrain.Trainer(callbacks=["optioned"], catalog=catalog,
                       plugin_options={"optioned": {"sise": 1}})


def test_an_unknown_option_of_an_unpackaged_plugin_names_it_without_empty_parentheses():
    """-p MODULE:CLASS with an option it does not have (from a config table): the message
    names the plugin and the keys, and no source it can't know (it said "... 'optioned' ()")."""
    with pytest.raises(ptrain.ConfigError) as info:
        ptrain.Trainer(callbacks=["tests.test_hook_contract:Optioned"],
                       plugin_options={"optioned": {"sise": 1}})
    assert str(info.value) == ("unknown option 'sise' for plugin 'optioned'; valid keys: label, "
                               "size. Did you mean 'size'?")


def test_check_available_is_asked_before_a_plugin_is_used():
    assert check_available(Optioned, "optioned") is None
    assert "lacks" in check_available(Unavailable, "unavailable")
    catalog = _catalog(unavailable="tests.test_hook_contract:Unavailable")
    with pytest.raises(PluginError, match="can't run on this machine: needs hardware"):
        ptrain.Trainer(callbacks=["unavailable"], catalog=catalog)


def test_declaration_hooks_must_be_static_on_a_class():
    with pytest.raises(PluginError, match="@staticmethod"):
        declare_options(InstanceMethodOptions, "bad")


class MisnamedOptionsArgument:
    @staticmethod
    @hookimpl
    def add_options(opts):
        opts.add("size", int, default=2)

    @staticmethod
    @hookimpl
    def check_available(trainer):
        return None


def test_a_declaration_hook_with_an_argument_the_spec_lacks_is_a_plugin_error():
    """add_options/check_available run on the class before pluggy checks the plugin: a wrong
    argument name was a bare TypeError from the core (exit code 1, no plugin named)."""
    with pytest.raises(PluginError, match=r"'bad' .*its add_options declares 'opts', which the "
                                          r"hook does not have; add_options's arguments are: "
                                          r"options\."):
        declare_options(MisnamedOptionsArgument, "bad")
    with pytest.raises(PluginError, match="its check_available declares 'trainer'.*: none"):
        check_available(MisnamedOptionsArgument, "bad")


def test_a_plugin_flag_that_clashes_with_another_is_an_error():
    from ptrain.cli import _build_parser
    from ptrain.options import OptionGroup

    group = OptionGroup("max")
    group.add("epochs", int)  # --max-epochs: the core's flag
    with pytest.raises(PluginError, match="--max-epochs is declared by both 'trainer' and 'max'"):
        _build_parser("fit", [(group, "max", "")])


class EveryoneSaysHello:
    """A strategy-like plugin whose all_gather_object answers for two processes."""

    name = "two-ranks"

    @hookimpl
    def all_gather_object(self, obj):
        return [obj, "hello from rank 1"]


def test_all_gather_object_defaults_to_one_process_and_can_be_taken_over(make_trainer):
    plain = make_trainer(max_epochs=1)
    assert plain.hook.all_gather_object(trainer=plain, obj={"x": 1}) == [{"x": 1}]
    taken = make_trainer(max_epochs=1, callbacks=["no:progress-bar", EveryoneSaysHello()])
    assert taken.hook.all_gather_object(trainer=taken, obj=3) == [3, "hello from rank 1"]


class LightningStyleCallback:
    """A callback written for Lightning: its methods carry no @hookimpl."""

    def on_train_epoch_end(self, trainer, pl_module):
        pass

    def on_train_start(self, trainer, pl_module):
        pass


class NothingAtAll:
    pass


def test_a_callback_object_is_adapted_by_its_lightning_names_or_refused_naming_it(
        make_trainer):
    trainer = make_trainer(callbacks=[LightningStyleCallback()])
    assert "callback-methods" in trainer.plugins  # its methods run at Lightning's points
    with pytest.raises(ptrain.PluginError, match="'nothing-at-all'.*implements no ptrain hook"
                                                 ".*@ptrain.hookimpl"):
        make_trainer(callbacks=[NothingAtAll()])


class OverridesNothing(Callback):
    """A Callback subclass whose one hook-like method is misspelled."""

    def on_train_epoch_ned(self, trainer, pl_module):
        pass


def test_a_callback_that_overrides_nothing_is_named_by_its_own_methods(make_trainer):
    """The message listed every method it inherits from Callback as its own, "named like
    Lightning's hooks"; it says that it overrides none, and names its own with the slip."""
    with pytest.raises(ptrain.PluginError) as refused:
        make_trainer(callbacks=[OverridesNothing()])
    message = str(refused.value)
    assert "It is a Callback that overrides none of Callback's methods; its own: " \
        "on_train_epoch_ned (did you mean on_train_epoch_end?)." in message, message
    assert "on_fit_start" not in message and "named like Lightning's" not in message


class MixesBoth:
    """A plain object (no ``Callback``) with a ptrain hook and Lightning's methods: registered
    as a plugin, its Lightning methods were never called, and nothing said so."""

    def __init__(self, calls=None):
        self.calls = calls if calls is not None else []

    @hookimpl
    def on_train_step_end(self, trainer, batch_idx):
        self.calls.append("on_train_step_end")

    def on_train_epoch_end(self, trainer, pl_module):
        self.calls.append("on_train_epoch_end")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.calls.append("on_train_batch_end")


class MixesBothOnPurpose(MixesBoth):
    not_ptrain_hooks = ("on_train_epoch_end", "on_train_batch_end")  # helpers it calls itself


class DerivesFromCallback(MixesBoth, Callback):
    """The fix the refusal names."""


@pytest.mark.parametrize("lightning", [False, True], ids=["ptrain", "ptrain.lightning"])
def test_a_plain_object_with_ptrain_hooks_and_lightning_methods_is_refused(tmp_path, lightning):
    import ptrain.lightning as ppl

    def make(*callbacks):
        if lightning:
            return ppl.Trainer(callbacks=list(callbacks), default_root_dir=str(tmp_path),
                               accelerator="cpu", enable_progress_bar=False, logger=False)
        return ptrain.Trainer(callbacks=["no:progress-bar", *callbacks], accelerator="cpu",
                              default_root_dir=str(tmp_path))

    message = (r"callback MixesBoth implements ptrain hooks \(methods marked @ptrain\.hookimpl"
               r"\) and has methods named like Lightning's callback methods \("
               r"MixesBoth\.on_train_epoch_end, MixesBoth\.on_train_batch_end\) without the "
               r"mark.*would never call them\. Derive MixesBoth from ptrain\.lightning\.Callback"
               r".*if on_train_batch_end is meant as the ptrain hook, mark it @ptrain\.hookimpl"
               r".*not_ptrain_hooks")
    with pytest.raises(PluginError, match=message):
        make(MixesBoth())
    if not lightning:  # a class, made by the trainer (as -p MODULE:CLASS)
        with pytest.raises(PluginError, match=message):
            make(MixesBoth)
    assert "mixes-both-on-purpose" in make(MixesBothOnPurpose()).plugins
    calls = []
    trainer = ptrain.Trainer(callbacks=["no:progress-bar", DerivesFromCallback(calls)],
                             accelerator="cpu", default_root_dir=str(tmp_path), max_epochs=1)
    trainer.fit(TinyRegressor())
    assert calls.count("on_train_step_end") == calls.count("on_train_batch_end") \
        == trainer.global_step > 0
    assert calls[-1] == "on_train_epoch_end"


class MarksSetup(Callback):
    """A ``Callback`` whose ptrain hook has a Lightning method's name: it was called as
    Lightning's ``setup(trainer, pl_module, stage=...)`` too, a TypeError."""

    def __init__(self):
        self.calls = []

    @hookimpl
    def setup(self, trainer, stage):
        self.calls.append(("setup", stage))

    def on_train_epoch_end(self, trainer, pl_module):
        self.calls.append(("on_train_epoch_end", trainer.current_epoch))


def test_a_callbacks_ptrain_hook_named_like_a_lightning_method_is_called_once_as_ptrains(
        make_trainer):
    callback = MarksSetup()
    make_trainer(callbacks=["no:progress-bar", callback], max_epochs=2).fit(TinyRegressor())
    assert callback.calls == [("setup", "fit"), ("on_train_epoch_end", 0),
                              ("on_train_epoch_end", 1)]


class MisnamedHook:
    @hookimpl
    def on_train_start(self, trainer):
        pass


def test_a_lightning_hook_name_suggests_the_ptrain_hook_that_means_the_same():
    with pytest.raises(ptrain.PluginError, match="Did you mean on_loop_start \\(loop='train'\\), "
                                                 "the hook meaning Lightning's 'on_train_start'"):
        register(create_plugin_manager(), MisnamedHook(), "misnamed")
