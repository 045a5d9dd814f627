"""The precision plugins ``bf16-mixed``, ``16-mixed`` (its scaler: test_16_mixed.py),
``bf16-true``, ``16-true`` and ``64-true``: selected by name from their installed
distributions, on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ptrain
from ptrain.catalog import Catalog
from ptrain.examples.digits import DigitsClassifier
from tests.conftest import TinyRegressor

#: Stated tolerance: a precision plugin reaches 32-true's validation accuracy on the digits
#: example (10 epochs, seed 0) within this many percentage points.
ACCURACY_TOLERANCE = 0.02


def test_installed_distributions_register_the_names():
    catalog = Catalog.discover()
    for name, dist in [("bf16-mixed", "ptrain-mixed-precision"),
                       ("16-mixed", "ptrain-mixed-precision"),
                       ("bf16-true", "ptrain-true-precision"),
                       ("16-true", "ptrain-true-precision"),
                       ("64-true", "ptrain-true-precision")]:
        assert catalog.get("precision", name).distribution == dist


def _digits_accuracy(make_trainer, precision: str) -> float:
    torch.manual_seed(0)
    module = DigitsClassifier()
    trainer = make_trainer(precision=precision, max_epochs=10, seed=0)
    trainer.fit(module)
    return float(trainer.callback_metrics["val_acc"])


@pytest.fixture(scope="module")
def reference_accuracy(tmp_path_factory):
    torch.manual_seed(0)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=10, seed=0,
                             default_root_dir=str(tmp_path_factory.mktemp("ref")),
                             callbacks=["no:progress-bar"])
    trainer.fit(DigitsClassifier())
    return float(trainer.callback_metrics["val_acc"])


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "16-mixed"])
def test_trains_the_example_as_well_as_32_true(make_trainer, reference_accuracy, precision):
    accuracy = _digits_accuracy(make_trainer, precision)
    assert accuracy >= reference_accuracy - ACCURACY_TOLERANCE, (accuracy, reference_accuracy)


class AutocastProbe(TinyRegressor):
    """Records, inside training_step, whether autocast is on and the dtype of its output."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        loss = nn.functional.mse_loss(out, y)
        self.seen = (torch.is_autocast_enabled("cpu"), out.dtype, x.dtype, loss.dtype)
        return loss


class StepProbe:
    name = "step-probe"

    @ptrain.hookimpl
    def backward(self, loss):
        self.in_backward = torch.is_autocast_enabled("cpu")

    @ptrain.hookimpl
    def on_before_optimizer_step(self, optimizer):
        self.before_step = torch.is_autocast_enabled("cpu")

    @ptrain.hookimpl
    def optimizer_step(self, optimizer):
        self.in_step = torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.bfloat16),
                                              ("16-mixed", torch.float16)])
def test_mixed_autocasts_forward_and_loss_but_not_backward_or_step(make_trainer, precision,
                                                                   dtype):
    module, probe = AutocastProbe(n=16), StepProbe()
    trainer = make_trainer(precision=precision, callbacks=["no:progress-bar", probe],
                           max_epochs=1)
    trainer.fit(module)
    autocast_on, out_dtype, input_dtype, _ = module.seen
    assert autocast_on and out_dtype == dtype and input_dtype == torch.float32
    assert (probe.in_backward, probe.before_step, probe.in_step) == (False, False, False)
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert trainer.precision_policy.compute_dtype == dtype
    assert trainer.precision_policy.param_dtype == torch.float32


@pytest.mark.parametrize("precision, dtype", [("bf16-true", torch.bfloat16),
                                              ("16-true", torch.float16),
                                              ("64-true", torch.float64)])
def test_true_precisions_cast_parameters_inputs_and_optimizer_state(make_trainer, precision,
                                                                    dtype):
    module = AutocastProbe(n=16, optimizer="adam", lr=1e-3)
    trainer = make_trainer(precision=precision, max_epochs=1)
    trainer.fit(module)
    autocast_on, out_dtype, input_dtype, loss_dtype = module.seen
    assert not autocast_on and (out_dtype, input_dtype, loss_dtype) == (dtype, dtype, dtype)
    assert all(p.dtype == dtype for p in module.parameters())
    state = trainer.optimizers[0].state
    assert all(s["exp_avg"].dtype == dtype for s in state.values())
    assert trainer.precision_policy.param_dtype == trainer.precision_policy.compute_dtype == dtype


class LazyTableRegressor(TinyRegressor):
    """Makes a layer in ``configure_model`` and, on first use in its step, a table without a
    dtype (as a positional encoding built lazily); logs a number float32 holds and bfloat16
    does not."""

    def configure_model(self):
        if not hasattr(self, "head"):
            self.head = nn.Linear(1, 1)
        self.table = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.table is None:
            self.table = torch.zeros(1)
        self.seen = (self.table.dtype, torch.get_default_dtype())
        self.log("logged", 1.0001)
        return nn.functional.mse_loss(self.head(self(x) + self.table), y)


@pytest.mark.parametrize("precision, dtype", [("bf16-true", torch.bfloat16),
                                              ("64-true", torch.float64)])
def test_true_precisions_make_the_steps_and_the_layers_tensors_in_their_dtype(make_trainer,
                                                                               precision, dtype):
    """A tensor made without a dtype in a step, or a layer made in ``configure_model``, is in
    the precision's dtype (under bf16-true a float32 table made the next layer's input float32,
    and its bfloat16 weight failed the matmul); outside them the default dtype is as it was,
    and a logged number is no narrower than float32."""
    module = LazyTableRegressor(n=16)
    trainer = make_trainer(precision=precision, max_epochs=1)
    trainer.fit(module)
    assert module.seen == (dtype, dtype)
    assert module.head.weight.dtype == dtype
    assert torch.get_default_dtype() == torch.float32
    assert float(trainer.callback_metrics["logged"]) == pytest.approx(1.0001, rel=1e-6)


def test_64_true_equals_a_hand_written_float64_loop(make_trainer):
    torch.manual_seed(0)
    module = TinyRegressor(n=32, batch_size=8, lr=0.05, with_val=False)
    reference = TinyRegressor(n=32, batch_size=8, lr=0.05, with_val=False)
    reference.load_state_dict(module.state_dict())
    reference.double()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _ in range(2):
        for x, y in reference.train_dataloader():
            loss = nn.functional.mse_loss(reference(x.double()), y.double())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    make_trainer(precision="64-true", max_epochs=2).fit(module)
    for ours, theirs in zip(module.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)


def test_bf16_true_resumes_with_its_optimizer_state_in_bfloat16(make_trainer):
    make_trainer(precision="bf16-true", max_epochs=1).fit(TinyRegressor(n=16, optimizer="adam"))
    trainer = make_trainer(precision="bf16-true", max_epochs=2)
    module = TinyRegressor(n=16, optimizer="adam")
    trainer.fit(module, ckpt_path="last")
    assert trainer.global_step == 4
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in trainer.optimizers[0].state.values())


class StepsInsideTheStep(TinyRegressor):
    """Manual optimization that runs the layer again after stepping it, in one training_step."""

    automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        optimizer = self.optimizers()
        loss = nn.functional.mse_loss(self(x), y)
        self.manual_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        layer = self.net[1]
        expected = nn.functional.linear(x.to(torch.bfloat16), layer.weight.to(torch.bfloat16),
                                        layer.bias.to(torch.bfloat16))
        self.after_step.append(torch.equal(self(x), expected))  # the stepped weights, cast anew

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_bf16_mixed_manual_optimization_never_uses_a_stale_weight_copy(make_trainer):
    module = StepsInsideTheStep()
    module.after_step = []
    make_trainer(precision="bf16-mixed", max_epochs=1, limit_train_batches=3).fit(module)
    # with autocast's weight cache on, the second forward reused the bf16 copy made before the
    # step
    assert module.after_step == [True, True, True]


class UsesItsLayerTwice(ptrain.TrainModule):
    """One step of SGD on a loss that runs the same layer on two inputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(16, 16)
        generator = torch.Generator().manual_seed(1)
        self.inputs = [torch.randn(8, 16, generator=generator) for _ in range(2)]

    def loss(self):
        return sum(self.layer(x).square().mean() for x in self.inputs)

    def training_step(self, batch, batch_idx):
        return self.loss()

    def train_dataloader(self):
        return [0]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


def _by_hand(cache: bool) -> torch.Tensor:
    module = UsesItsLayerTwice()
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
        loss = module.loss()
    loss.backward()
    return module.layer.weight.detach() - module.layer.weight.grad


@pytest.mark.parametrize("cache", [True, False])
def test_the_autocast_cache_option_decides_where_a_weight_used_twice_sums_its_gradients(
        make_trainer, cache):
    """With the cache (the default) the two bfloat16 gradients are summed before the cast to
    float32; without it (``autocast_cache`` false, as Lightning) each is cast, then summed."""
    assert not torch.equal(_by_hand(True), _by_hand(False))  # the option makes a difference
    module = UsesItsLayerTwice()
    options = {} if cache else {"plugin_options": {"bf16-mixed": {"autocast_cache": False}}}
    make_trainer(precision="bf16-mixed", max_steps=1, **options).fit(module)
    assert torch.equal(module.layer.weight.detach(), _by_hand(cache))


class MoonsWithAdam(ptrain.TrainModule):
    """docs/first-model.md's model in small: AdamW with its default eps=1e-8."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(512, 2, generator=g), torch.randint(0, 2, (512,), generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)


def test_a_nan_loss_under_16_true_names_adams_eps_and_its_fixes(make_trainer):
    """The precision plugin's non_finite_hint joins the core's NaN message: under 16-true,
    Adam's eps=1e-8 is 0 in float16 (docs/precision.md); the fixes are bf16-true or a larger
    eps. Other precisions give the general advice only."""
    torch.manual_seed(0)
    with pytest.raises(ptrain.NonFiniteLossError) as info:
        make_trainer(precision="16-true", max_epochs=1, log_every_n_steps=1).fit(MoonsWithAdam())
    message = str(info.value)  # the parameters' check comes first here
    assert "Lower the learning rate" in message, message
    assert "Under 16-true" in message and "eps=1e-8 is 0 there" in message, message
    assert "--precision bf16-true" in message and "eps >= 1e-4" in message, message

    class GoesNaN(TinyRegressor):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) * float("nan")

    for precision in ("16-true", "32-true", "bf16-true"):  # the loss's own check
        with pytest.raises(ptrain.NonFiniteLossError) as info:
            make_trainer(precision=precision, max_epochs=1).fit(GoesNaN())
        message = str(info.value)
        assert message.startswith("the training loss became nan") and \
            "Lower the learning rate" in message, message
        assert ("Under 16-true" in message) == (precision == "16-true"), message
