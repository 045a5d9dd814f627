"""A step with a finite loss but NaN gradients leaves NaN weights; no checkpoint may then be
written over a finite one, and the run says which steps the state went bad between
(issue 35). Through the CLI, in real processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ptrain
from tests._cli_util import assert_usage_error
from tests.conftest import TinyRegressor, run_cli

pytestmark = pytest.mark.slow

#: 32 rows in batches of 8: 4 steps an epoch; batch 7 is the last of the second epoch
MODEL = ["--model", "tests._cli_models:NaNGradientRegressor", "--model.n", "32",
         "--accelerator", "cpu", "--seed", "0", "-p", "no:tensorboard", "--no-progress-bar"]


def _last(root: Path) -> dict:
    return torch.load(root / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)


def _all_finite(checkpoint: dict) -> bool:
    tensors = list(checkpoint["model"].values())
    for optimizer in checkpoint["optimizers"]:
        for state in optimizer["state"].values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def test_nan_weights_at_an_epoch_end_keep_the_previous_checkpoint_and_it_resumes(tmp_path):
    root = tmp_path / "runs"
    failed = run_cli("fit", *MODEL, "--model.nan_at", "7", "--max-epochs", "3",
                     "--default-root-dir", str(root))
    message = assert_usage_error(failed, "after global step 4", "by step 8",
                                 "parameter 'net.1.", "loss stayed finite")
    assert "last.ckpt" in message and "is kept" in message, message
    kept = _last(root)
    assert kept["loop"]["global_step"] == 4 and _all_finite(kept)
    # what the message promises: the kept checkpoint resumes (without the bad batch now)
    resumed = run_cli("fit", *MODEL, "--model.nan_at", "-1", "--max-epochs", "3",
                      "--default-root-dir", str(root), "--ckpt-path", "last")
    assert resumed.returncode == 0, resumed.stderr
    assert _last(root)["loop"]["global_step"] == 12 and _all_finite(_last(root))


@pytest.mark.parametrize("writes", [[], ["--checkpoint-async-save"],
                                    ["--checkpoint-async-save", "--checkpoint-on-write-error",
                                     "warn"]],
                         ids=["synchronous", "background", "background, warn"])
def test_a_checkpoint_every_step_names_the_step_that_went_bad(tmp_path, writes):
    """In the background the copy is checked on the writer's thread: the refusal comes at the
    next step boundary, with the same words, and nothing non-finite is written. It stops the
    run under ``on_write_error="warn"`` too: that policy is for writes the system refuses, and
    non-finite state is no such write."""
    root = tmp_path / "runs"
    failed = run_cli("fit", *MODEL, "--model.nan_at", "5", "--max-epochs", "2",
                     "--checkpoint-every-n-train-steps", "1", "--default-root-dir", str(root),
                     *writes)
    assert_usage_error(failed, "after global step 5", "by step 6", "parameter 'net.1.",
                       "nothing non-finite was saved")
    kept = _last(root)
    assert kept["loop"]["global_step"] == 5 and _all_finite(kept)


@pytest.mark.parametrize("async_save", [False, True], ids=["synchronous", "background"])
def test_optimizer_state_is_checked_too(tmp_path, async_save):
    """Adam's moments can go non-finite while the weights are still finite (here: set by
    hand): the checkpoint is refused, naming the state."""

    class BadMoments:
        name = "bad-moments"

        @ptrain.hookimpl
        def on_epoch_end(self, trainer):
            if trainer.current_epoch == 1:
                optimizer = trainer.optimizers[0]
                state = next(iter(optimizer.state.values()))
                state["exp_avg_sq"].fill_(float("inf"))

    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=3, seed=0,
                             default_root_dir=str(tmp_path / "runs"),
                             callbacks=["no:tensorboard", "no:progress-bar", "no:results",
                                        "no:model-summary", BadMoments()],
                             plugin_options={"checkpoint": {"async_save": async_save}})
    with pytest.raises(ptrain.NonFiniteStateError, match="optimizer 0's 'exp_avg_sq' of 'net"):
        trainer.fit(TinyRegressor(n=32, optimizer="adam"))
    assert _last(tmp_path / "runs")["loop"]["global_step"] == 4


def test_a_weights_only_background_save_does_not_vouch_for_the_optimizer_state(tmp_path):
    """A weights-only copy holds no optimizer state, so its check on the writer's thread says
    nothing of Adam's moments: the steps the error names start at the last check that covered
    them (the first epoch's end, a log point too), not at the last weights-only save. (The
    checkpoint callback's weights-only files always come with a full ``last.ckpt``: a user's
    own saves are where a weights-only write stands alone.)"""

    class WeightsEveryStep:
        name = "weights-every-step"

        @ptrain.hookimpl
        def on_train_batch_end(self, trainer):
            if trainer.global_step == 5:
                state = next(iter(trainer.optimizers[0].state.values()))
                state["exp_avg_sq"].fill_(float("inf"))  # the weights stay finite
            trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True,
                                    asynchronous=True)

    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=3, seed=0, log_every_n_steps=4,
                             default_root_dir=str(tmp_path / "runs"),
                             callbacks=["no:tensorboard", "no:progress-bar", "no:results",
                                        "no:model-summary", "no:checkpoint",
                                        WeightsEveryStep()])
    with pytest.raises(ptrain.NonFiniteStateError,
                       match=r"after global step 4 \(the last check found it finite\) and by "
                             r"step 8 \(first: optimizer 0's 'exp_avg_sq'"):
        trainer.fit(TinyRegressor(n=32, optimizer="adam"))
    assert torch.load(tmp_path / "weights.ckpt", weights_only=True)["weights_only"]


class HalfPrecisionFiles:
    """scripts/hook_examples.py's plugin: checkpoints with the weights cast to bfloat16, so
    the copies written are not copies of the parameters."""

    name = "half-precision-files"

    @staticmethod
    def halved(checkpoint):
        model = {k: v.bfloat16() if v.is_floating_point() else v
                 for k, v in checkpoint["model"].items()}
        return {**checkpoint, "model": model}

    @ptrain.hookimpl
    def save_checkpoint(self, trainer, checkpoint, path):
        torch.save(self.halved(checkpoint), path)
        return True

    @ptrain.hookimpl
    def save_checkpoint_in_background(self, trainer, checkpoint, path):
        copy = trainer.copy_for_background(self.halved(checkpoint))
        return [lambda: torch.save(copy, path)]


def test_a_background_save_of_something_made_from_the_weights_checks_the_weights(tmp_path):
    """The check of a background save's copies covers the state only where the copies are of
    the state: a plugin that writes the weights cast is checked on the training thread, as a
    synchronous save is, and no file of a NaN step is written."""

    class NaNWeightsAtStepFive:
        name = "nan-weights-at-step-five"

        @ptrain.hookimpl
        def on_train_batch_end(self, trainer):
            if trainer.global_step == 5:
                with torch.no_grad():
                    next(trainer.module.parameters()).fill_(float("nan"))
            trainer.save_checkpoint(tmp_path / f"step{trainer.global_step}.ckpt",
                                    asynchronous=True)

    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=3, seed=0, log_every_n_steps=100,
                             default_root_dir=str(tmp_path / "runs"),
                             callbacks=["no:tensorboard", "no:progress-bar", "no:results",
                                        "no:model-summary", "no:checkpoint",
                                        NaNWeightsAtStepFive(), HalfPrecisionFiles()])
    with pytest.raises(ptrain.NonFiniteStateError,
                       match=r"after global step 4 \(the last check found it finite\) and by "
                             r"step 5 \(first: parameter 'net"):
        trainer.fit(TinyRegressor(n=32, optimizer="adam"))
    written = sorted(p.name for p in tmp_path.glob("step*.ckpt"))
    assert written == [f"step{i}.ckpt" for i in range(1, 5)], written
    assert all(torch.isfinite(t.float()).all()
               for i in range(1, 5)
               for t in torch.load(tmp_path / f"step{i}.ckpt", weights_only=True)["model"].values()
               if t.is_floating_point())


class BadMomentsOnEveryRank:
    """Sets Adam's second moments of the state this process steps to inf after epoch 1. Under
    zero1 that is the rank's shard, held by the inner optimizer."""

    name = "bad-moments-every-rank"

    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        if trainer.current_epoch == 1:
            optimizer = trainer.optimizers[0]
            live = getattr(optimizer, "optim", optimizer)
            for state in live.state.values():
                state["exp_avg_sq"].fill_(float("inf"))


def test_a_sharded_optimizers_own_shard_is_what_is_checked(tmp_path):
    """torch's ZeroRedundancyOptimizer steps an inner optimizer; its own ``state`` stays empty
    (or holds None for the other ranks' parameters after a resume), so the check must read the
    inner one."""
    trainer = ptrain.Trainer(accelerator="cpu", strategy="zero1", devices=2, max_epochs=3,
                             seed=0, default_root_dir=str(tmp_path / "runs"),
                             callbacks=["no:tensorboard", "no:progress-bar", "no:results",
                                        "no:model-summary", BadMomentsOnEveryRank()])
    with pytest.raises(ptrain.NonFiniteStateError, match="optimizer 0's 'exp_avg_sq' of 'net"):
        trainer.fit(TinyRegressor(n=32, optimizer="adam"))
    assert _last(tmp_path / "runs")["loop"]["global_step"] == 2
