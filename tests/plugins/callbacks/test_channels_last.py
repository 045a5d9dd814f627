"""The ``channels-last`` callback (distribution ``ptrain-channels-last``): real fits on the CPU of
the kit's ``TinyConvModule`` (a 3x3 convolution on 2x4x4 images); the layout is read from the
tensors' strides (``is_contiguous(memory_format=torch.channels_last)``)."""

from __future__ import annotations

import pytest
import torch

import ptrain
from ptrain import ConfigError
from ptrain.testing import TinyConvModule, TinyModule
from ptrain_channels_last import ChannelsLast
from tests._cli_util import assert_usage_error
from tests.conftest import run_cli
from conftest import DIGITS_CONFIG

QUIET = ["no:progress-bar", "no:tensorboard", "no:model-summary"]
CHANNELS_LAST = torch.channels_last


class LayoutProbe(TinyConvModule):
    """Records, per training step, whether its image batch and its convolution weight are
    channels-last."""

    def __init__(self):
        super().__init__()
        self.batch_layouts: list[bool] = []
        self.weight_layouts: list[bool] = []

    def training_step(self, batch, batch_idx):
        self.batch_layouts.append(batch[0].is_contiguous(memory_format=CHANNELS_LAST))
        self.weight_layouts.append(
            self.net[0].weight.is_contiguous(memory_format=CHANNELS_LAST))
        return super().training_step(batch, batch_idx)


def fit(root, module, *callbacks, **options):
    trainer = ptrain.Trainer(max_epochs=2, seed=0, default_root_dir=str(root),
                             callbacks=[*QUIET, *callbacks], **options)
    trainer.fit(module)
    return trainer


def test_weights_and_image_batches_are_channels_last_and_train_as_before(tmp_path):
    plain_probe, probe = LayoutProbe(), LayoutProbe()
    plain = fit(tmp_path / "plain", plain_probe)
    plugin = ChannelsLast()
    converted = fit(tmp_path / "cl", probe, plugin)
    assert [name.split(".")[-3:] for name in plugin.converted] == [["net", "0", "weight"]]
    assert probe.batch_layouts and all(probe.batch_layouts)
    assert all(probe.weight_layouts)
    assert not any(plain_probe.batch_layouts) and not any(plain_probe.weight_layouts)
    for a, b in zip(plain.module.parameters(), converted.module.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # a layout, not other numbers


def test_its_checkpoint_resumes_without_the_plugin(tmp_path):
    fit(tmp_path, TinyConvModule(), ChannelsLast())
    last = tmp_path / "version_0" / "checkpoints" / "last.ckpt"
    resumed = ptrain.Trainer(max_epochs=3, seed=0, default_root_dir=str(tmp_path),
                             callbacks=QUIET)
    resumed.fit(TinyConvModule(), ckpt_path=str(last))
    assert resumed.current_epoch == 3
    weight = resumed.module.net[0].weight
    assert weight.is_contiguous()  # the model's own layout: the values came from the file


def test_a_model_without_convolutions_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match="has no 4-D weight .* would change nothing"):
        fit(tmp_path, TinyModule(), ChannelsLast())
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
def test_the_cli_refuses_it_for_the_digits_mlp(tmp_path):
    result = run_cli("fit", "--config", DIGITS_CONFIG, "-p", "channels-last",
                     "--default-root-dir", str(tmp_path / "runs"))
    assert_usage_error(result, "-p channels-last", "DigitsClassifier has no 4-D weight")
