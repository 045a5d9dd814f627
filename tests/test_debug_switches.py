"""Debug switches of the core: off by default, one option away."""

from __future__ import annotations

import pytest
import torch

import ptrain

from tests.conftest import TinyRegressor


class SqrtOfZero(TinyRegressor):
    """A finite loss whose backward makes a NaN: d/dx sqrt(x) at 0 is inf, times 0 is NaN."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        zero = (self.net[1].bias - self.net[1].bias.detach()).sum()  # 0, but on the graph
        return loss + 0.0 * torch.sqrt(zero)


@pytest.mark.filterwarnings("ignore:Error detected in SqrtBackward0")  # anomaly mode's own report
def test_detect_anomaly_names_the_forward_operation_whose_backward_made_a_nan(make_trainer):
    trainer = make_trainer(max_epochs=1, detect_anomaly=True)
    with pytest.raises(RuntimeError, match="SqrtBackward0"):
        trainer.fit(SqrtOfZero())
    assert trainer.global_step == 0  # stopped at the first backward, before any step
    assert not torch.is_anomaly_enabled()  # the previous mode is back, also after an error


def test_without_detect_anomaly_the_nan_goes_into_the_weights_and_the_state_check_stops_it(
        make_trainer):
    module = SqrtOfZero()
    trainer = make_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0)
    # the loss itself stays finite, so autograd says nothing; the finite-state check at the
    # epoch's end stops the run before a checkpoint holds the NaN weights
    with pytest.raises(ptrain.NonFiniteStateError, match="parameter 'net.1.bias'"):
        trainer.fit(module)
    assert trainer.global_step == 1
    assert torch.isnan(module.net[1].bias).all()
    assert not (trainer.run_dir / "checkpoints" / "last.ckpt").exists()


def test_detect_anomaly_is_off_by_default_and_restored_after_a_run(make_trainer):
    seen = []

    class Probe(TinyRegressor):
        def training_step(self, batch, batch_idx):
            seen.append(torch.is_anomaly_enabled())
            return super().training_step(batch, batch_idx)

    make_trainer(max_epochs=1, limit_train_batches=2).fit(Probe())
    make_trainer(max_epochs=1, limit_train_batches=2, detect_anomaly=True).fit(Probe())
    assert seen == [False, False, True, True]
    assert not torch.is_anomaly_enabled()


def test_detect_anomaly_is_a_cli_flag(cli, tmp_path):
    result = cli("fit", "--model", "tests.conftest:TinyRegressor", "--accelerator", "cpu",
                 "--max-epochs", "1", "--detect-anomaly", "--default-root-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
