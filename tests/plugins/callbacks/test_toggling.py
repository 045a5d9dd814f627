"""The ``toggling`` callback plugin and ``toggle_model``: which parameters get gradients, what is
restored (on exceptions too, and when toggles nest), ``sync_grad``, the usage errors, the numbers
(against plain PyTorch loops that switch ``requires_grad`` by hand), ``16-mixed`` with several
optimizers, and the GAN example.

Everything runs on real torch in this process (single process: what a module records in its
``training_step`` is visible after ``fit``), except two runs of the real CLI, started up front by
the ``cli_runs`` fixture so that they overlap with the in-process tests.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import ptrain
from ptrain.module import ManualOptimizer
from ptrain_toggling import toggle_model
from tests._cli_util import CLIRuns, assert_ok, assert_usage_error
from tests.conftest import TinyRegressor, make_regression_data

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]
#: A loss scale the tiny models' float16 activations carry without overflow (with the default
#: 2**16 the first steps overflow and are skipped, which would blur the step-by-step comparison).
FITTING_SCALE = {"16-mixed": {"init_scale": 1024.0}}


class Boom(Exception):
    """Raised by the tests inside a toggle."""


def fit(make_trainer, module, *callbacks, max_epochs: int = 1, quiet=QUIET, **options):
    trainer = make_trainer(max_epochs=max_epochs, callbacks=[*callbacks, *quiet], **options)
    trainer.fit(module)
    return trainer


def trainable(module: nn.Module) -> dict[str, bool]:
    return {name: p.requires_grad for name, p in module.named_parameters()}


# ---------------------------------------------------------------------------------------------
# A module with two parts, a shared parameter, a parameter in no optimizer and a frozen one


class Parts(ptrain.TrainModule):
    """Part A (``a``) and part B (``b``), each with its optimizer; ``shared`` is in both
    optimizers; ``loose`` is in none (but in the loss); ``frozen`` was frozen by the user and is
    in A's list. ``training_step`` hands over to ``scenario(module, opt_a, opt_b, batch)``."""

    automatic_optimization = False

    def __init__(self, scenario, n: int = 16, batch_size: int = 8):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(3, 1)
        self.shared = nn.Parameter(torch.tensor(1.5))
        self.loose = nn.Parameter(torch.tensor(0.1))
        self.frozen = nn.Parameter(torch.full((3,), 0.7), requires_grad=False)
        self.scenario = scenario
        self.records: list = []
        self.data, self.batch_size = make_regression_data(n), batch_size

    def loss(self, batch) -> torch.Tensor:  # every parameter takes part
        x, y = batch
        hidden = self.a(x) * self.frozen * self.shared
        return F.mse_loss(self.b(hidden) + self.loose, y)

    def training_step(self, batch, batch_idx):
        opt_a, opt_b = self.optimizers()
        self.scenario(self, opt_a, opt_b, batch)
        return self.loss(batch).detach()

    def configure_optimizers(self):
        return [torch.optim.SGD(self.a_params(), lr=0.01),
                torch.optim.SGD(self.b_params(), lr=0.01)]

    def a_params(self):
        return [self.a.weight, self.a.bias, self.frozen, self.shared]

    def b_params(self):
        return [self.b.weight, self.b.bias, self.shared]

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


def names_of(module: nn.Module, params) -> set[str]:
    ids = {id(p) for p in params}
    return {name for name, p in module.named_parameters() if id(p) in ids}


def grads_of_a_backward(module: Parts, batch) -> set[str]:
    """The parameters that a backward of the full loss, from no gradients, gives a gradient."""
    for p in module.parameters():
        p.grad = None
    module.manual_backward(module.loss(batch))
    got = {name for name, p in module.named_parameters() if p.grad is not None}
    for p in module.parameters():
        p.grad = None
    return got


def test_inside_a_toggle_only_the_other_optimizers_parameters_are_switched_off(make_trainer):
    def scenario(m, opt_a, opt_b, batch):
        record = {"entry": trainable(m), "outside": grads_of_a_backward(m, batch)}
        with toggle_model(opt_a):
            record["in_a"], record["in_a_grads"] = trainable(m), grads_of_a_backward(m, batch)
        record["after_a"] = trainable(m)
        with toggle_model(opt_b):
            record["in_b"], record["in_b_grads"] = trainable(m), grads_of_a_backward(m, batch)
        record["after_b"] = trainable(m)
        m.records.append(record)

    module = Parts(scenario)
    initial = trainable(module)
    everything = set(initial)
    in_a, in_b = names_of(module, module.a_params()), names_of(module, module.b_params())
    a_only, b_only = in_a - in_b, in_b - in_a
    user_frozen = {name for name, flag in initial.items() if not flag}
    assert b_only == {"b.weight", "b.bias"} and user_frozen == {"frozen"}  # the setup is as meant
    assert in_a & in_b == {"shared"} and everything - in_a - in_b == {"loose"}

    fit(make_trainer, module, "toggling")

    assert len(module.records) == 2  # 16 samples, batches of 8
    for record in module.records:
        assert record["entry"] == initial
        # outside any toggle: every parameter that requires grad gets one
        assert record["outside"] == everything - user_frozen
        # inside A's toggle: B's own parameters are off; A's, the shared and the loose one are on
        assert {n for n, on in record["in_a"].items() if not on} == b_only | user_frozen
        assert record["in_a_grads"] == everything - b_only - user_frozen
        assert {n for n, on in record["in_b"].items() if not on} == a_only | user_frozen
        assert record["in_b_grads"] == everything - a_only - user_frozen
        assert {"shared", "loose"} <= record["in_a_grads"] & record["in_b_grads"]
        assert record["after_a"] == initial and record["after_b"] == initial
    assert trainable(module) == initial  # the user's frozen parameter is still frozen after fit


@pytest.mark.parametrize("sync_grad", [True, False])
def test_sync_grad_sets_sync_gradients_inside_and_it_is_restored_after(make_trainer, sync_grad):
    def scenario(m, opt_a, opt_b, batch):
        before = m.trainer.sync_gradients
        with toggle_model(opt_b, sync_grad=sync_grad):
            inside = m.trainer.sync_gradients
        m.records.append((before, inside, m.trainer.sync_gradients))

    module = Parts(scenario)
    fit(make_trainer, module, "toggling")
    # manual optimization, no accumulation: every backward outside a toggle is synchronised
    assert module.records == [(True, sync_grad, True)] * 2


def test_an_exception_caught_inside_training_step_leaves_everything_restored(make_trainer):
    def scenario(m, opt_a, opt_b, batch):
        try:
            with toggle_model(opt_a, sync_grad=False):
                m.records.append(("inside", trainable(m), m.trainer.sync_gradients))
                raise Boom()
        except Boom:
            m.records.append(("after", trainable(m), m.trainer.sync_gradients))

    module = Parts(scenario)
    initial = trainable(module)
    fit(make_trainer, module, "toggling")
    assert [r[0] for r in module.records] == ["inside", "after"] * 2
    for (_, inside, synced_inside), (_, after, synced_after) in zip(module.records[::2],
                                                                  module.records[1::2]):
        assert {n for n, on in inside.items() if not on} == {"b.weight", "b.bias", "frozen"}
        assert synced_inside is False
        assert after == initial and synced_after is True


def test_an_exception_out_of_fit_reaches_the_caller_and_leaves_requires_grad_restored(
        make_trainer):
    raised = Boom("from inside the toggle")

    def scenario(m, opt_a, opt_b, batch):
        with toggle_model(opt_b, sync_grad=False):
            m.records.append((trainable(m), m.trainer.sync_gradients))
            if len(m.records) == 2:  # the second batch
                raise raised

    module = Parts(scenario)
    initial = trainable(module)
    trainer = make_trainer(max_epochs=1, callbacks=["toggling", *QUIET])
    with pytest.raises(Boom) as info:
        trainer.fit(module)
    assert info.value is raised
    assert len(module.records) == 2
    for inside, synced in module.records:  # the toggle was in force when it was raised
        assert {n for n, on in inside.items() if not on} == {"a.weight", "a.bias", "frozen"}
        assert synced is False
    assert trainable(module) == initial
    assert trainer.sync_gradients is True


def test_nested_toggles_restore_the_outer_toggles_state(make_trainer):
    def scenario(m, opt_a, opt_b, batch):
        record = {"entry": (trainable(m), m.trainer.sync_gradients)}
        with toggle_model(opt_a):
            record["outer"] = (trainable(m), m.trainer.sync_gradients)
            with toggle_model(opt_b, sync_grad=False):
                record["inner"] = (trainable(m), m.trainer.sync_gradients)
                record["inner_grads"] = grads_of_a_backward(m, batch)
            record["back"] = (trainable(m), m.trainer.sync_gradients)
        record["after"] = (trainable(m), m.trainer.sync_gradients)
        m.records.append(record)

    module = Parts(scenario)
    initial = trainable(module)
    fit(make_trainer, module, "toggling")
    assert len(module.records) == 2
    for record in module.records:
        outer, outer_sync = record["outer"]
        inner, inner_sync = record["inner"]
        assert {n for n, on in outer.items() if not on} == {"b.weight", "b.bias", "frozen"}
        # both parts' own parameters are off; the shared and the loose parameter are not
        assert {n for n, on in inner.items() if not on} == {"a.weight", "a.bias", "b.weight",
                                                           "b.bias", "frozen"}
        assert record["inner_grads"] == {"shared", "loose"}
        assert (outer_sync, inner_sync) == (True, False)
        assert record["back"] == (outer, True)  # B's parameters are still off: A's toggle holds
        assert record["entry"] == record["after"] == (initial, True)


# ---------------------------------------------------------------------------------------------
# Usage errors


def test_toggle_model_without_the_plugin_says_how_to_add_it(make_trainer):
    def scenario(m, opt_a, opt_b, batch):
        with toggle_model(opt_a):
            m.records.append("entered")

    module = Parts(scenario)
    initial = trainable(module)
    with pytest.raises(ptrain.ConfigError) as info:
        fit(make_trainer, module)  # no "toggling"
    message = str(info.value)
    for needle in ("toggling plugin", "-p toggling", 'callbacks = ["toggling"]',
                   'Trainer(callbacks=["toggling"])'):
        assert needle in message, message
    assert module.records == [] and trainable(module) == initial


def test_toggle_model_with_the_raw_torch_optimizer_says_to_use_self_optimizers(make_trainer):
    def scenario(m, opt_a, opt_b, batch):
        with toggle_model(m.trainer.optimizers[0]):  # the torch.optim.SGD itself
            m.records.append("entered")

    module = Parts(scenario)
    with pytest.raises(ptrain.ModelError) as info:
        fit(make_trainer, module, "toggling")
    message = str(info.value)
    assert "SGD" in message and "self.optimizers()" in message, message
    assert module.records == []


def test_toggle_model_with_an_optimizer_not_of_this_run_is_a_model_error(make_trainer):
    def scenario(m, opt_a, opt_b, batch):
        stranger = ManualOptimizer(m.trainer, torch.optim.SGD(m.a.parameters(), lr=0.1))
        with toggle_model(stranger):
            m.records.append("entered")

    module = Parts(scenario)
    initial = trainable(module)
    with pytest.raises(ptrain.ModelError) as info:
        fit(make_trainer, module, "toggling")
    message = str(info.value)
    assert "not one of this run's" in message and "self.optimizers()" in message, message
    assert module.records == [] and trainable(module) == initial


def test_the_plugin_refuses_a_module_with_automatic_optimization_before_training(make_trainer):
    module = TinyRegressor()
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = make_trainer(max_epochs=1, callbacks=["toggling", *QUIET])
    with pytest.raises(ptrain.ConfigError) as info:
        trainer.fit(module)
    message = str(info.value)
    for needle in ("TinyRegressor", "automatic optimization", "automatic_optimization = False",
                   "remove -p toggling"):
        assert needle in message, message
    assert trainer.global_step == 0
    assert all(torch.equal(v, initial[k]) for k, v in module.state_dict().items())


def test_manual_optimization_with_accumulate_grad_batches_is_a_usage_error(make_trainer):
    module = Parts(lambda *args: None)
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = make_trainer(max_epochs=1, accumulate_grad_batches=2,
                           callbacks=["toggling", *QUIET])
    with pytest.raises(ptrain.ConfigError) as info:
        trainer.fit(module)
    message = str(info.value)
    for needle in ("accumulate_grad_batches=2", "Parts", "optimizes manually",
                   "toggle_model(opt, sync_grad=False)", "Remove accumulate_grad_batches"):
        assert needle in message, message
    assert trainer.global_step == 0
    assert all(torch.equal(v, initial[k]) for k, v in module.state_dict().items())


# ---------------------------------------------------------------------------------------------
# The numbers: a GAN-like step against plain PyTorch


def gan_losses(generator, discriminator, real, z):
    """The discriminator's loss (on real and generated samples, not detached: without toggling
    it would give the generator gradients too) and the generator's."""
    ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)

    def d_loss():
        return (F.binary_cross_entropy_with_logits(discriminator(real), ones)
                + F.binary_cross_entropy_with_logits(discriminator(generator(z)), zeros))

    def g_loss():
        return F.binary_cross_entropy_with_logits(discriminator(generator(z)), ones)

    return d_loss, g_loss


class TinyGAN(ptrain.TrainModule):
    """A generator and a discriminator of a few units, SGD each; the latent vectors are part of
    the data, so that nothing random happens during training. Steps the discriminator
    ``d_steps`` times per batch, then the generator once, each inside its toggle."""

    automatic_optimization = False

    def __init__(self, sync_grad: bool = True, d_steps: int = 1, lr: float = 0.1):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.generator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 4))
            self.discriminator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        g = torch.Generator().manual_seed(1)
        real = 0.5 * torch.randn(32, 4, generator=g) + 1.0
        self.data = TensorDataset(real, torch.randn(32, 2, generator=g))
        self.sync_grad, self.d_steps, self.lr = sync_grad, d_steps, lr

    def training_step(self, batch, batch_idx):
        opt_g, opt_d = self.optimizers()
        d_loss, g_loss = gan_losses(self.generator, self.discriminator, *batch)
        for _ in range(self.d_steps):
            with toggle_model(opt_d, sync_grad=self.sync_grad):
                self.manual_backward(d_loss())
                opt_d.step()
                opt_d.zero_grad()
        with toggle_model(opt_g, sync_grad=self.sync_grad):
            loss = g_loss()
            self.manual_backward(loss)
            opt_g.step()
            opt_g.zero_grad()
        return loss.detach()

    def configure_optimizers(self):
        return [torch.optim.SGD(self.generator.parameters(), lr=self.lr),
                torch.optim.SGD(self.discriminator.parameters(), lr=self.lr)]

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8)


GAN_BATCHES = 4  # TinyGAN: 32 samples in batches of 8


def plain_gan(module: TinyGAN, epochs: int, mode: str, d_steps: int = 1, autocast: bool = False):
    """The same training as ``TinyGAN`` under the trainer, in plain PyTorch, on copies of the
    module's untrained parts. ``mode``: ``"switch"`` sets requires_grad by hand around each
    part's step; ``"zero"`` switches nothing but clears both parts' gradients before each
    backward; ``"none"`` does neither (each backward also fills the other part's gradients, and
    they pile up into its next step). ``autocast``: the forward and the loss under float16
    autocast, as 16-mixed runs them (gradients unscaled, the optimizer steps in float32)."""
    generator, discriminator = copy.deepcopy(module.generator), copy.deepcopy(module.discriminator)
    opt_g = torch.optim.SGD(generator.parameters(), lr=module.lr)
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=module.lr)
    batches = list(module.train_dataloader())

    def step(loss_fn, optimizer, other):
        if mode == "switch":
            other.requires_grad_(False)
        if mode == "zero":
            generator.zero_grad()
            discriminator.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        other.requires_grad_(True)

    for _ in range(epochs):
        for real, z in batches:
            d_loss, g_loss = gan_losses(generator, discriminator, real, z)
            for _ in range(d_steps):
                step(d_loss, opt_d, generator)
            step(g_loss, opt_g, discriminator)
    return generator, discriminator


def max_difference(first: nn.Module, second: nn.Module) -> float:
    return max((a - b).abs().max().item()
               for a, b in zip(first.parameters(), second.parameters()))


@pytest.mark.parametrize("sync_grad", [True, False])  # one process: sync_grad changes nothing
def test_toggled_gan_training_equals_plain_pytorch_with_requires_grad_switched_by_hand(
        make_trainer, sync_grad):
    module = TinyGAN(sync_grad=sync_grad)
    reference = {mode: plain_gan(module, epochs=3, mode=mode) for mode in ("switch", "zero")}
    trainer = fit(make_trainer, module, "toggling", max_epochs=3)
    assert trainer.global_step == 3 * GAN_BATCHES * 2
    for generator, discriminator in reference.values():
        torch.testing.assert_close(dict(module.generator.named_parameters()),
                                   dict(generator.named_parameters()), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(dict(module.discriminator.named_parameters()),
                                   dict(discriminator.named_parameters()), rtol=1e-5, atol=1e-6)


def test_without_toggling_stray_gradients_would_change_both_parts():
    """What the comparison above guards against: the same loop without switching (or zeroing)
    lets each backward leave gradients in the other part, which its next step then uses."""
    module = TinyGAN()
    toggled = plain_gan(module, epochs=3, mode="switch")
    polluted = plain_gan(module, epochs=3, mode="none")
    untrained = (module.generator, module.discriminator)
    for clean, dirty, start in zip(toggled, polluted, untrained):
        moved = max_difference(clean, start)
        assert moved > 1e-2  # the parts trained at all
        assert max_difference(clean, dirty) > 0.25 * moved


# ---------------------------------------------------------------------------------------------
# 16-mixed: one scaler for both optimizers


def test_16_mixed_trains_a_toggled_gan_with_one_scaler_updated_once_per_batch(make_trainer):
    module = TinyGAN()
    untrained = copy.deepcopy(module)
    epochs = 2
    trainer = fit(make_trainer, module, "toggling", max_epochs=epochs, precision="16-mixed",
                  plugin_options=FITTING_SCALE, quiet=["no:progress-bar", "no:tensorboard"])
    assert trainer.global_step == epochs * GAN_BATCHES * 2
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert max_difference(module, untrained) > 1e-2
    generator, discriminator = plain_gan(untrained, epochs, mode="switch", autocast=True)
    torch.testing.assert_close(dict(module.generator.named_parameters()),
                               dict(generator.named_parameters()), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(dict(module.discriminator.named_parameters()),
                               dict(discriminator.named_parameters()), rtol=1e-3, atol=1e-4)
    scaler = trainer.plugins["16-mixed"].scaler
    # no overflow (nothing was skipped: the comparison above), no growth before 2000 good
    # updates, and one update per batch, not per optimizer step
    assert scaler.get_scale() == FITTING_SCALE["16-mixed"]["init_scale"]
    assert scaler.state_dict()["_growth_tracker"] == epochs * GAN_BATCHES
    saved = torch.load(trainer.last_checkpoint_path, weights_only=True)
    assert saved["plugins"]["16-mixed"] == scaler.state_dict()


def test_16_mixed_refuses_an_optimizer_stepped_twice_in_one_batch(make_trainer):
    module = TinyGAN(d_steps=2)
    initial = trainable(module)
    trainer = make_trainer(max_epochs=1, precision="16-mixed", plugin_options=FITTING_SCALE,
                           callbacks=["toggling", *QUIET])
    with pytest.raises(ptrain.PluginError) as info:
        trainer.fit(module)
    message = str(info.value)
    for needle in ("optimizer 1 stepped twice in batch 0", "16-mixed",
                   "step each optimizer at most once per training_step", "bf16-mixed"):
        assert needle in message, message
    assert trainer.global_step == 1  # the first step of the discriminator, then the error
    assert trainable(module) == initial  # raised inside a toggle: everything switched back


def test_32_true_lets_an_optimizer_step_twice_in_one_batch(make_trainer):
    module = TinyGAN(d_steps=2)
    trainer = fit(make_trainer, module, "toggling", max_epochs=2)
    assert trainer.global_step == 2 * GAN_BATCHES * 3
    generator, discriminator = plain_gan(TinyGAN(), epochs=2, mode="switch", d_steps=2)
    torch.testing.assert_close(dict(module.generator.named_parameters()),
                               dict(generator.named_parameters()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dict(module.discriminator.named_parameters()),
                               dict(discriminator.named_parameters()), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The GAN example, and the CLI


@pytest.fixture(scope="module")
def cli_runs(request, tmp_path_factory):
    """The module's CLI runs, started before its first test so that they overlap with the
    others; ``cli_runs.dirs[key]`` is a run's scratch folder."""
    pool = CLIRuns(request)
    automatic = pool.dirs["automatic"] = tmp_path_factory.mktemp("automatic")
    pool.start("automatic", "fit", "--model", "tests.conftest:TinyRegressor", "--accelerator",
               "cpu", "-p", "toggling", "--max-epochs", "1", "--default-root-dir",
               str(automatic / "runs"),
               used_by=("test_cli_toggling_with_automatic_optimization_is_a_usage_error",))
    gan = pool.dirs["gan"] = tmp_path_factory.mktemp("gan")
    pool.start("gan", "fit", "--config", "examples/gan.toml", "--max-epochs", "2",
               "--default-root-dir", str(gan / "runs"),
               used_by=("test_cli_trains_the_gan_example_from_its_config_file",))
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def _start_cli_runs(cli_runs):
    """Every test of the module asks for the CLI runs, so that they start with the first."""


def test_cli_toggling_with_automatic_optimization_is_a_usage_error(cli_runs):
    result = cli_runs["automatic"]
    message = assert_usage_error(result, "TinyRegressor", "automatic_optimization = False",
                                 "remove -p toggling")
    assert "\n\n" not in message.strip()  # one paragraph
    assert not list(cli_runs.dirs["automatic"].rglob("*.ckpt"))  # nothing trained


def test_cli_trains_the_gan_example_from_its_config_file(cli_runs):
    from ptrain.examples.digits import digits_datasets

    result = cli_runs["gan"]
    assert_ok(result)
    checkpoints = list((cli_runs.dirs["gan"] / "runs").rglob("last.ckpt"))
    assert len(checkpoints) == 1, result.stdout
    saved = torch.load(checkpoints[0], weights_only=True)
    batches = len(digits_datasets()[0]) // 64  # batch_size 64, drop_last
    assert saved["loop"]["epoch"] == 2
    assert saved["loop"]["global_step"] == 2 * batches * 2  # two optimizers step per batch
    assert saved["config"]["trainer"]["callbacks"] == ["toggling"]
    assert "val_fd" in result.stdout + result.stderr


def test_the_gan_example_improves_the_generator(make_trainer):
    from examples.gan import DigitsGAN, digit_score, frechet_distance

    with torch.random.fork_rng():
        torch.manual_seed(0)  # the untrained weights (fit's seed=0 seeds the training after)
        module = DigitsGAN()

    def measure():
        """val_fd and val_digit_score of the generator's samples from val_latents, as the
        example's validation computes them (eval mode: BatchNorm's running statistics)."""
        mode = module.training
        module.eval()
        with torch.no_grad():
            fake = module.generator(module.val_latents)
            fd = frechet_distance(module.val_set.tensors[0], fake).item()
            score = digit_score(module.classifier[0](fake).softmax(1)).item()
        module.train(mode)
        return fd, score

    fd_before, score_before = measure()
    trainer = fit(make_trainer, module, "toggling", max_epochs=15, seed=0)
    fd_after, score_after = measure()
    metrics = trainer.callback_metrics  # the last validation ran after the last step
    assert math.isclose(float(metrics["val_fd"]), fd_after, rel_tol=1e-4)
    assert math.isclose(float(metrics["val_digit_score"]), score_after, rel_tol=1e-4)
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert fd_after < 0.5 * fd_before, (fd_before, fd_after)
    assert score_after > score_before + 1.0, (score_before, score_after)
