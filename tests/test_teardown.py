"""A plugin whose ``teardown`` raises: the others still release what they hold, a finished
stage stays finished (exit 0, its checkpoint and results), and a failed stage raises its own
error (issue 35)."""

from __future__ import annotations

import pytest
import torch

import ptrain
from tests._teardown_plugins import FailsInTeardown, RecordsTeardown
from tests.conftest import TinyRegressor, run_cli

QUIET = ["no:tensorboard", "no:progress-bar", "no:model-summary"]


@pytest.mark.slow
def test_a_failing_teardown_leaves_a_finished_fit_finished(tmp_path):
    root = tmp_path / "runs"
    result = run_cli("fit", "--model", "tests.conftest:TinyRegressor", "--model.n", "32",
                     "--accelerator", "cpu", "--max-epochs", "2", "--default-root-dir",
                     str(root), "-p", "no:tensorboard", "--no-progress-bar",
                     "-p", "tests._teardown_plugins:FailsInTeardown")
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "teardown" in line]
    assert warning and "plugin 'fails-in-teardown' (module tests._teardown_plugins) raised OSError in its teardown hook" in warning[0], result.stderr
    assert "the upload service refused the connection" in warning[0]
    assert "Traceback" not in result.stderr
    # the results callback still printed, and the checkpoint is the finished run's
    assert "Training finished: 2 epoch(s), 8 steps" in result.stdout
    last = torch.load(root / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["loop"]["global_step"] == 8


def test_every_teardown_runs_and_a_failed_stage_raises_its_own_error(tmp_path):
    recorder = RecordsTeardown()

    class BrokenStep(TinyRegressor):
        def training_step(self, batch, batch_idx):
            raise ValueError("bad batch")

        def teardown(self, stage):
            self.torn_down = stage

    module = BrokenStep(n=32)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1,
                             default_root_dir=str(tmp_path / "runs"),
                             callbacks=[*QUIET, recorder, FailsInTeardown()])
    with pytest.warns(UserWarning, match="fails-in-teardown.*OSError.*already failed"):
        with pytest.raises(ValueError, match="bad batch"):
            trainer.fit(module)
    # the plugins registered before the failing one, the wrapper and the module: all released
    assert recorder.released == ["fit before", "fit after"]
    assert module.torn_down == "fit"
