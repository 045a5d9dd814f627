"""Smoke uses of ``ptrain.lightning.core``."""

from __future__ import annotations

import ptrain
import ptrain.lightning as pl
from ptrain.lightning import core


def _same_classes():
    assert core.LightningModule is pl.LightningModule is ptrain.TrainModule
    assert core.LightningDataModule is pl.LightningDataModule is ptrain.DataModule


SMOKE = {"LightningModule": _same_classes, "LightningDataModule": _same_classes}
