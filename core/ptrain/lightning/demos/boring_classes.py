"""``lightning.pytorch.demos.boring_classes``: the tiny models, data sets and data modules that
Lightning's own tests and many bug reports are written with.

They are built to be subclassed with one method changed, so each keeps Lightning's layer
shapes, method names and signatures, return values and creation order: after the same
``seed_everything`` a ``BoringModel`` starts from the same weights and a ``RandomDataset``
holds the same numbers as Lightning's, and a fit gives the same weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from ptrain.module import DataModule as LightningDataModule
from ptrain.module import TrainModule as LightningModule


class RandomDataset(Dataset):
    """``length`` vectors of ``size`` standard-normal numbers, drawn once when it is made."""

    def __init__(self, size: int, length: int):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class RandomDictDataset(Dataset):
    """Like :class:`RandomDataset`, each item a dict: ``{"a": vector, "b": vector + 2}``."""

    def __init__(self, size: int, length: int):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        vector = self.data[index]
        return {"a": vector, "b": vector + 2}

    def __len__(self) -> int:
        return self.len


class RandomIterableDataset(IterableDataset):
    """``count`` fresh random vectors of ``size`` per pass, drawn as they are read; no
    ``len()``."""

    def __init__(self, size: int, count: int):
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(self.count):
            yield torch.randn(self.size)


class RandomIterableDatasetWithLen(IterableDataset):
    """Like :class:`RandomIterableDataset` (not a subclass of it, as in Lightning), and it
    answers ``len()`` with ``count``."""

    def __init__(self, size: int, count: int):
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(len(self)):
            yield torch.randn(self.size)

    def __len__(self) -> int:
        return self.count


class BoringModel(LightningModule):
    """One ``Linear(32, 2)`` trained towards ones with a mean squared error, by SGD (lr 0.1)
    with a ``StepLR`` that divides the rate by ten after each epoch. Each stage reads a
    ``RandomDataset(32, 64)`` one sample per batch.

    Meant to be subclassed with the method under study replaced::

        class LogsItsLoss(BoringModel):
            def training_step(self, batch, batch_idx):
                loss = self.step(batch)
                self.log("train_loss", loss)
                return loss

    ``training_step`` returns ``{"loss": loss}``, ``validation_step`` ``{"x": loss}`` and
    ``test_step`` ``{"y": loss}``; none of them logs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def loss(self, preds: Tensor, labels: Tensor | None = None) -> Tensor:
        """Mean squared distance of ``preds`` from ``labels`` (all ones when not given): a
        loss with no meaning whose gradients still move every weight."""
        return F.mse_loss(preds, torch.ones_like(preds) if labels is None else labels)

    def step(self, batch: Any) -> Tensor:
        """The loss of the batch's predictions."""
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64))


class ManualOptimBoringModel(BoringModel):
    """:class:`BoringModel` optimised by hand (``automatic_optimization = False``): each
    training step zeroes the gradients, runs ``manual_backward`` and steps the optimizer, and
    returns the loss tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        optimizer = self.optimizers()
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class BoringDataModule(LightningDataModule):
    """256 random vectors of 32 numbers (drawn when the data module is made), cut into four
    parts of 64 in this order: training, validation, test, prediction. ``setup(stage)`` makes
    the parts that stage reads (``"fit"`` both the training and the validation part); every
    loader reads one sample per batch, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def _part(self, index: int) -> Subset:
        return Subset(self.random_full, indices=range(64 * index, 64 * (index + 1)))

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = self._part(0)
        if stage in ("fit", "validate"):
            self.random_val = self._part(1)
        if stage == "test":
            self.random_test = self._part(2)
        if stage == "predict":
            self.random_predict = self._part(3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.random_predict)


class BoringDataModuleNoLen(LightningDataModule):
    """Loaders over :class:`RandomIterableDataset` (no ``len()``): 512 training, 128
    validation, 256 test and 64 prediction vectors of 32 numbers, one per batch."""

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = RandomIterableDataset(32, 512)
        if stage in ("fit", "validate"):
            self.random_val = RandomIterableDataset(32, 128)
        if stage == "test":
            self.random_test = RandomIterableDataset(32, 256)
        if stage == "predict":
            self.random_predict = RandomIterableDataset(32, 64)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.random_predict)


class IterableBoringDataModule(LightningDataModule):
    """Each stage's dataloader method returns a *list* of two loaders, one over a
    :class:`RandomDataset` and one over a :class:`RandomIterableDataset` of vectors of 4
    numbers (16 of each for training, 32 validation, 64 test, 128 prediction)."""

    _SIZES = {"train": 16, "val": 32, "test": 64, "predict": 128}

    def setup(self, stage: str) -> None:
        def pair(part: str) -> list[Dataset]:
            size = self._SIZES[part]
            return [RandomDataset(4, size), RandomIterableDataset(4, size)]

        if stage == "fit":
            self.train_datasets = pair("train")
        if stage in ("fit", "validate"):
            self.val_datasets = pair("val")
        if stage == "test":
            self.test_datasets = pair("test")
        if stage == "predict":
            self.predict_datasets = pair("predict")

    def train_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.train_datasets]

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.val_datasets]

    def test_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.test_datasets]

    def predict_dataloader(self) -> list[DataLoader]:
        return [DataLoader(d) for d in self.predict_datasets]


class DemoModel(LightningModule):
    """``relu(Linear(32, out_dim)(x))`` on flattened inputs, trained by Adam at
    ``learning_rate`` to make the sum of its outputs small (the loss is that sum)."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02):
        super().__init__()
        self.l1 = nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_nb: int) -> Any:
        return self(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """A small MNIST classifier (plain ``nn.Module``): two 3x3 convolutions (32 and 64
    channels), 2x2 max pooling, dropout 0.25, a 9216-128 layer, dropout 0.5 and a 128-10
    layer; returns log-probabilities. Takes ``(batch, 1, 28, 28)`` images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)
