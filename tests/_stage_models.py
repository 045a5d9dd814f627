"""Modules with test and predict steps, for the stage tests (``tests/test_stages.py``). They live
in an importable module: the CLI subprocesses and the workers of a 2-rank run import them."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ptrain import DataModule
from tests.conftest import TinyRegressor, make_regression_data


class StagedRegressor(TinyRegressor):
    """TinyRegressor with ``test_step`` and ``predict_step`` and their own data; records its
    hyperparameters."""

    def __init__(self, n: int = 32, batch_size: int = 8, lr: float = 0.1, test_n: int = 20,
                 predict_n: int = 10, predict_batch: int = 3, shuffle: bool = False):
        super().__init__(n=n, batch_size=batch_size, lr=lr, shuffle=shuffle)
        self.save_hyperparameters()
        self.test_set = make_regression_data(test_n, seed=2)
        self.predict_x = make_regression_data(predict_n, seed=3).tensors[0]
        self.predict_batch = predict_batch

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y), prog_bar=True)

    def predict_step(self, batch, batch_idx):
        (x,) = batch
        return {"y": self(x), "row": x[:, 0]}

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=8)

    def predict_dataloader(self):
        return DataLoader(TensorDataset(self.predict_x), batch_size=self.predict_batch)


class NoPredictStep(TinyRegressor):
    """Neither predict_step nor forward: predict has nothing to run."""

    forward = nn.Module.forward


class LogsInPredict(StagedRegressor):
    def predict_step(self, batch, batch_idx):
        self.log("oops", 1.0)
        return super().predict_step(batch, batch_idx)


class BrokenValidation(TinyRegressor):
    """A validation_step with a bug; records the training steps it ran."""

    def __init__(self):
        super().__init__()
        self.train_steps = 0

    def training_step(self, batch, batch_idx):
        self.train_steps += 1
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        return self(x).view(3, -1)  # 8 outputs do not make 3 rows: a bug


class RecordingData(DataModule):
    """A DataModule that appends each of its calls, with the process's rank, to ``record``."""

    def __init__(self, record: str, n: int = 32):
        super().__init__()
        self.record, self.n = record, n
        self.epochs_seen = 0

    def _note(self, what: str) -> None:
        import os

        with open(self.record, "a", encoding="utf-8") as f:
            f.write(f"{os.environ.get('RANK', '0')} {what}\n")

    def prepare_data(self):
        self._note("prepare_data")

    def setup(self, stage):
        self._note(f"setup {stage}")

    def teardown(self, stage):
        self._note(f"teardown {stage}")

    def train_dataloader(self):
        self._note("train_dataloader")
        self.epochs_seen += 1
        return DataLoader(make_regression_data(self.n), batch_size=8)

    def state_dict(self):
        return {"epochs_seen": self.epochs_seen}

    def load_state_dict(self, state):
        self._note(f"load_state_dict {state['epochs_seen']}")
