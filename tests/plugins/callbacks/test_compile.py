"""The ``compile`` callback plugin: real ``torch.compile``, nothing of torch replaced.

Compiles are slow, so the runs are shared: ``runs`` (module scope) trains ``TinyRegressor`` eager
and compiled with the ``aot_eager`` backend (dynamo and AOTAutograd, no code generation) once,
and the tests check different things of the same runs. One test compiles with inductor (C++
kernels on CPU), one runs a real 2-rank gloo DDP job, and one CLI run checks the exit code of a
usage error. A missing C++ compiler is a real one: inductor's own compiler setting is pointed at a
path that does not exist, and inductor's own lookup fails.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import ptrain
from ptrain import ConfigError, PluginError
from ptrain_compile import Compile
from tests._cli_util import CLIRuns, assert_usage_error
from tests.conftest import TinyRegressor

QUIET = ["no:progress-bar", "no:tensorboard"]
EPOCHS = 2
STEPS_PER_EPOCH = 8  # TinyRegressor: 64 samples, batches of 8; 16 validation samples
REPORT = re.compile(r"compile \((\w+)\): ([\d.]+) s in (\d+) step\(s\) that compiled \((\d+) "
                    r"graphs, ([\d.]+) s compiling\)(?: and ([\d.]+) s compiling the sanity "
                    r"check's validation before training)?; then ([\d.]+) ms per step "
                    r"\((\d+) steps\)")


def fit(root: Path, *callbacks, module: ptrain.TrainModule | None = None,
        ckpt_path: str | None = None, **options):
    """Train (a fresh seeded ``TinyRegressor`` unless given) and return (trainer, module,
    what was printed)."""
    torch.manual_seed(0)
    module = module if module is not None else TinyRegressor(n=64, batch_size=8, lr=0.1)
    options.setdefault("max_epochs", EPOCHS)
    trainer = ptrain.Trainer(default_root_dir=str(root), accelerator="cpu",
                             callbacks=[*callbacks, *QUIET], **options)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        trainer.fit(module, ckpt_path=ckpt_path)
    return trainer, module, printed.getvalue()


@pytest.fixture(scope="module")
def cli_runs(request, tmp_path_factory):
    """The module's one CLI run, started with its first test so that it overlaps the others."""
    pool = CLIRuns(request, workers=1)
    root = tmp_path_factory.mktemp("cli")
    pool.start("bad-backend", "fit", "--model", "tests.conftest:TinyRegressor", "--accelerator",
               "cpu", "--max-epochs", "1", "--default-root-dir", str(root), "-p", "compile",
               "--compile-backend", "inductr", *[arg for name in QUIET for arg in ("-p", name)],
               used_by=("test_bad_backend_on_the_command_line_is_a_usage_error",))
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def _start_cli_runs(cli_runs):
    """Every test asks for the CLI run, so that it starts with the first one selected."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The eager and the ``aot_eager``-compiled run of the same seeded model, data and steps."""
    root = tmp_path_factory.mktemp("compile")
    eager = fit(root / "eager")
    plugin = Compile(backend="aot_eager")
    compiled = fit(root / "compiled", plugin)
    return {"eager": eager, "compiled": compiled, "plugin": plugin, "root": root}


def plain_regressor():
    """A seeded TinyRegressor without ``self.log`` (its graphs do not depend on the metric
    store): one forward and one backward graph to compile."""

    class PlainRegressor(TinyRegressor):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

    torch.manual_seed(0)
    return PlainRegressor(n=16, batch_size=8, lr=0.1, with_val=False)


# -- training is the same ----------------------------------------------------------------------


def test_compiled_training_matches_eager(runs):
    eager_trainer, eager_module, _ = runs["eager"]
    trainer, module, _ = runs["compiled"]
    plugin = runs["plugin"]
    assert plugin.compiled and plugin.graphs >= 2  # a training graph and a no_grad one
    assert trainer.global_step == eager_trainer.global_step == EPOCHS * STEPS_PER_EPOCH
    torch.testing.assert_close(module.state_dict(), eager_module.state_dict(),
                               rtol=1e-5, atol=1e-6)
    for name in ("train_loss", "val_loss"):
        torch.testing.assert_close(trainer.callback_metrics[name],
                                   eager_trainer.callback_metrics[name], rtol=1e-5, atol=1e-6)


def test_the_strategy_model_is_compiled_in_place_and_the_users_module_is_not(runs):
    trainer, module, _ = runs["compiled"]
    assert trainer.module is module
    assert type(trainer.model) is ptrain.StepModule  # not an OptimizedModule wrapper
    assert trainer.model.module is module
    assert not any(key.startswith("_orig_mod") for key in trainer.model.state_dict())
    # the user's module still runs eagerly after fit: dynamo compiles nothing for it
    before = runs["plugin"].graphs
    with torch.no_grad():
        module(torch.randn(3, 4))
    assert runs["plugin"].graphs == before


def test_inductor_matches_eager(tmp_path):
    trainer, compiled, printed = fit(tmp_path / "inductor", Compile(), module=plain_regressor(),
                                     max_epochs=1)
    _, eager, _ = fit(tmp_path / "eager", module=plain_regressor(), max_epochs=1)
    assert trainer.plugins["compile"].graphs >= 1
    assert "compile (inductor):" in printed
    torch.testing.assert_close(compiled.state_dict(), eager.state_dict(), rtol=1e-5, atol=1e-5)


# -- the report --------------------------------------------------------------------------------


def test_compile_time_is_reported_apart_from_step_time(runs):
    _, _, printed = runs["compiled"]
    plugin = runs["plugin"]
    lines = [line for line in printed.splitlines() if line.startswith("compile")]
    assert len(lines) == 1, printed
    match = REPORT.fullmatch(lines[0])
    assert match, lines[0]
    (backend, step_s, compile_steps, graphs, compiling_s, sanity_s, per_step_ms,
     steady) = match.groups()
    assert backend == "aot_eager"
    assert (int(compile_steps), int(graphs), int(steady)) == (
        plugin.compile_steps, plugin.graphs, plugin.steady_steps)
    total = EPOCHS * STEPS_PER_EPOCH
    # every step is either compiling or steady, except validation steps that compiled nothing
    assert 1 <= plugin.compile_steps < total
    assert total - EPOCHS <= plugin.compile_steps + plugin.steady_steps <= total
    # the compilations happened inside the compiling steps, which are the slow ones
    assert plugin.compile_step_seconds >= plugin.compile_seconds > 0
    assert (plugin.compile_step_seconds / plugin.compile_steps
            > plugin.steady_step_seconds / plugin.steady_steps)
    assert float(per_step_ms) == pytest.approx(
        plugin.steady_step_seconds / plugin.steady_steps * 1e3, abs=0.01)
    assert float(step_s) == pytest.approx(plugin.compile_step_seconds, abs=0.05)
    assert float(compiling_s) == pytest.approx(plugin.compile_seconds, abs=0.05)
    # the sanity check's validation compiled its graph before the first training step
    assert float(sanity_s) == pytest.approx(plugin.before_training_seconds, abs=0.05)
    assert plugin.before_training_seconds > 0


def test_eager_run_prints_no_report(runs):
    _, _, printed = runs["eager"]
    assert "compile" not in printed


# -- checkpoints -------------------------------------------------------------------------------


def test_checkpoint_written_under_compile_resumes_uncompiled(runs, tmp_path):
    trainer, module, _ = runs["compiled"]
    saved = torch.load(trainer.last_checkpoint_path, map_location="cpu", weights_only=True)
    assert set(saved["model"]) == set(module.state_dict())  # net.1.weight, net.1.bias
    assert not any("_orig_mod" in key for key in saved["model"])
    # one more epoch, uncompiled, from the compiled run's checkpoint ...
    resumed, resumed_module, _ = fit(tmp_path / "resumed", max_epochs=EPOCHS + 1,
                                     ckpt_path=str(trainer.last_checkpoint_path))
    assert resumed.global_step == (EPOCHS + 1) * STEPS_PER_EPOCH
    # ... is the run that was never compiled nor interrupted
    _, straight, _ = fit(tmp_path / "straight", max_epochs=EPOCHS + 1)
    torch.testing.assert_close(resumed_module.state_dict(), straight.state_dict(),
                               rtol=1e-5, atol=1e-6)


# -- options -----------------------------------------------------------------------------------


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        Compile(backend="inductr")
    message = str(info.value)
    for name in ("inductor", "aot_eager", "eager"):
        assert name in message
    assert "Did you mean 'inductor'?" in message


def test_unknown_mode_lists_the_choices(tmp_path):
    with pytest.raises(ConfigError) as info:
        Compile(mode="fast")
    for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        assert mode in str(info.value)
    # the same through the option (config key / flag): the core names the flag and the choices
    with pytest.raises(ConfigError, match=r"--compile-mode.*valid choices: default, "
                                          r"reduce-overhead, max-autotune"):
        ptrain.Trainer(default_root_dir=str(tmp_path), callbacks=["compile", *QUIET],
                       plugin_options={"compile": {"mode": "fast"}})


def test_an_inductor_mode_with_another_backend_is_refused():
    with pytest.raises(ConfigError, match="max-autotune.*inductor setting.*aot_eager"):
        Compile(mode="max-autotune", backend="aot_eager")


def test_dynamic_takes_true_false_or_auto(tmp_path):
    def resolved(value):
        trainer = ptrain.Trainer(default_root_dir=str(tmp_path), callbacks=["compile", *QUIET],
                                 plugin_options={"compile": {"dynamic": value}})
        return trainer.plugins["compile"].dynamic

    assert (resolved("true"), resolved(False), resolved("auto")) == (True, False, None)
    with pytest.raises(ConfigError, match="--compile-dynamic.*true, false or auto"):
        resolved("sometimes")


def test_bad_backend_on_the_command_line_is_a_usage_error(cli_runs):
    assert_usage_error(cli_runs["bad-backend"], "--compile-backend", "unknown torch.compile backend 'inductr'",
                       "inductor", "aot_eager")


# -- a backend that can't run here -------------------------------------------------------------


@pytest.fixture
def no_cxx():
    """inductor's C++ compiler setting, pointed at nothing (inductor's own lookup then fails)."""
    with torch._inductor.config.patch({"cpp.cxx": (None, "/nonexistent/c++")}):
        yield


def test_inductor_without_a_cxx_compiler_is_an_error_naming_the_fixes(tmp_path, no_cxx):
    with pytest.raises(PluginError) as info:
        fit(tmp_path, Compile(), module=plain_regressor(), max_epochs=1)
    message = str(info.value)
    for needle in ("C++ compiler", "CXX", "--compile-backend aot_eager",
                   "--compile-fallback eager"):
        assert needle in message


def test_fallback_eager_warns_and_trains_uncompiled(tmp_path, no_cxx):
    plugin = Compile(fallback="eager")
    with pytest.warns(UserWarning, match="C\\+\\+ compiler.*training uncompiled"):
        trainer, _, printed = fit(tmp_path, plugin, module=plain_regressor(), max_epochs=1)
    assert trainer.global_step == 2
    assert not plugin.compiled and "C++ compiler" in plugin.fell_back
    assert plugin.graphs == 0 and "compile" not in printed


# -- with ddp ----------------------------------------------------------------------------------


def test_compiled_ddp_trains_like_eager_ddp(tmp_path, capfd):
    """Eager DDP on 2 ranks with batch 8 trains like one process with batch 16 (test_ddp.py);
    so must compiled DDP, also with gradient accumulation (the ddp strategy skips the all-reduce
    inside the window: it still sees its DistributedDataParallel). The report is rank 0's."""
    torch.manual_seed(0)
    ddp_module = TinyRegressor(batch_size=8, lr=0.1)
    single_module = copy.deepcopy(ddp_module)
    single_module.batch_size = 16
    single, _, _ = fit(tmp_path / "single", module=single_module, accumulate_grad_batches=2)
    ddp = ptrain.Trainer(default_root_dir=str(tmp_path / "ddp"), accelerator="cpu",
                         strategy="ddp", devices=2, max_epochs=EPOCHS, accumulate_grad_batches=2,
                         callbacks=[Compile(backend="aot_eager"), *QUIET, "no:checkpoint"],
                         plugin_options={"ddp": {"timeout": 120.0}})
    capfd.readouterr()
    ddp.fit(ddp_module)
    out = capfd.readouterr().out
    assert ddp.global_step == single.global_step
    torch.testing.assert_close(ddp_module.state_dict(), single_module.state_dict(),
                               rtol=1e-5, atol=1e-6)
    # val_loss is reduced across the ranks (train_loss, a step value, is rank 0's own)
    torch.testing.assert_close(ddp.callback_metrics["val_loss"],
                               single.callback_metrics["val_loss"], rtol=1e-5, atol=1e-6)
    reports = [line for line in out.splitlines() if line.startswith("compile (aot_eager):")]
    assert len(reports) == 1, out
    assert int(REPORT.fullmatch(reports[0]).group(4)) >= 1  # rank 0 compiled graphs
