"""Tests of the ``gradient-noise`` callback, written only with ptrain's public API and the plugin
kit (``ptrain.testing``: the ``ptrain_fit``/``hook_recorder`` fixtures and ``CallbackSuite``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ptrain
from ptrain.testing import CallbackSuite, TinyModule
from ptrain_gradient_noise import GradientNoise


class TestGradientNoiseConformance(CallbackSuite):
    plugin = "gradient-noise"
    options = {"eta": 0.01, "seed": 3}


class GradientsBefore:
    """The gradients before any other callback touched them (after unscaling, if any)."""

    name = "gradients-before"

    def __init__(self):
        self.steps: list[list[torch.Tensor]] = []

    @ptrain.hookimpl(tryfirst=True)
    def on_before_optimizer_step(self, optimizer):
        self.steps.append([p.grad.clone() for g in optimizer.param_groups for p in g["params"]])


class GradientsAfter(GradientsBefore):
    """The gradients the optimizer is about to apply."""

    name = "gradients-after"

    @ptrain.hookimpl(trylast=True)
    def on_before_optimizer_step(self, optimizer):
        super().on_before_optimizer_step(optimizer)


def trained(ptrain_fit, *plugins, **options) -> dict[str, torch.Tensor]:
    module = TinyModule()
    ptrain_fit(*plugins, module=module, **options)
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def test_the_noise_is_the_seeded_annealed_draw(ptrain_fit, hook_recorder):
    noise = GradientNoise(eta=0.3, gamma=0.55, seed=7)
    before, after = GradientsBefore(), GradientsAfter()
    trainer = ptrain_fit(before, noise, after, hook_recorder, max_epochs=1)
    assert len(before.steps) == len(after.steps) == trainer.global_step == 4
    draws = torch.Generator().manual_seed(7)
    for step, (clean, noisy) in enumerate(zip(before.steps, after.steps)):
        std = (0.3 / (1 + step) ** 0.55) ** 0.5
        for grad, with_noise in zip(clean, noisy):
            expected = std * torch.randn(grad.shape, generator=draws)
            torch.testing.assert_close(with_noise - grad, expected, rtol=1e-4, atol=1e-6)
    # it ran between the two probes, in every optimizer step
    calls = hook_recorder.calls_of("on_before_optimizer_step")
    assert [c.plugins for c in calls] == [["gradients-before", "gradient-noise",
                                           "gradients-after"]] * 4


def test_the_same_seed_gives_the_same_run_and_another_seed_another(ptrain_fit):
    first = trained(ptrain_fit, GradientNoise(eta=0.3, seed=1))
    again = trained(ptrain_fit, GradientNoise(eta=0.3, seed=1))
    other = trained(ptrain_fit, GradientNoise(eta=0.3, seed=2))
    without = trained(ptrain_fit)
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert not all(torch.equal(first[n], other[n]) for n in first)
    assert not all(torch.equal(first[n], without[n]) for n in first)


def test_it_draws_nothing_from_the_global_generators(ptrain_fit):
    # the data order comes from torch's global generator: the batches are those of a run
    # without the plugin
    class Batches:
        name = "batches"

        def __init__(self):
            self.seen = []

        @ptrain.hookimpl
        def on_train_batch_end(self, batch):
            self.seen.append(batch[0].clone())

    with_noise, without = Batches(), Batches()
    ptrain_fit(GradientNoise(eta=1.0), with_noise)
    ptrain_fit(without)
    assert len(with_noise.seen) == len(without.seen) == 8
    assert all(torch.equal(a, b) for a, b in zip(with_noise.seen, without.seen))


class RankWeights:
    """Each process writes its trained weights to ``<folder>/rank<N>.pt`` at the end (a class
    of an importable module: the worker processes unpickle it)."""

    name = "rank-weights"

    def __init__(self, folder: str):
        self.folder = folder

    @ptrain.hookimpl
    def teardown(self, trainer):
        torch.save(trainer.module.state_dict(), Path(self.folder) / f"rank{trainer.global_rank}.pt")


@pytest.mark.slow
def test_every_ddp_rank_adds_the_same_noise(ptrain_fit, tmp_path):
    # ddp averages the gradients, then each rank adds its noise: the replicas stay equal only
    # if the noise is the same on every rank
    ptrain_fit("ddp", GradientNoise(eta=1.0, seed=5), RankWeights(str(tmp_path)), devices=2,
               max_epochs=1)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])


@pytest.mark.parametrize("options, message", [
    ({"eta": 0.0}, "eta .* must be positive"),
    ({"gamma": -1.0}, "gamma .* must be >= 0"),
])
def test_bad_options_are_usage_errors(ptrain_fit, options, message):
    with pytest.raises(ptrain.ConfigError, match=message):
        ptrain_fit("gradient-noise", plugin_options={"gradient-noise": options})
