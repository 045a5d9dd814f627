"""``lightning.pytorch.demos.mnist_datamodule``: MNIST as a data set and as a data module.

:func:`MNIST` answers as Lightning's does: torchvision's ``MNIST`` data set when torchvision is
installed (PIL images for its ``transform``), otherwise the copy Lightning hosts, already
turned into tensors (:class:`HostedMNIST`). The environment variable ``PL_USE_MOCKED_MNIST``
selects the hosted copy even with torchvision installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, random_split

from ptrain.lightning.demos._download import DataUnavailableError, fetch
from ptrain.module import DataModule as LightningDataModule

_DATASETS_PATH = "./data"


class HostedMNIST(Dataset):
    """MNIST from the two files Lightning hosts (``training.pt`` and ``test.pt``, each a pair
    ``(images, labels)``: ``uint8`` images of shape ``(N, 28, 28)`` and integer labels), kept in
    ``root/MNIST/complete``. Missing files are downloaded from :attr:`RESOURCES` when
    ``download`` is true; a failed download, or missing files with ``download=False``, is a
    :class:`~ptrain.lightning.demos._download.DataUnavailableError` naming the addresses and the
    folder to put the files in.

    An item is ``(image, label)``: the image a float tensor ``(1, 28, 28)`` of the pixel values
    0-255, less ``normalize[0]`` and divided by ``normalize[1]`` (``normalize=None`` keeps the
    raw values), then given to ``transform`` if one is passed; the label an ``int``, given to
    ``target_transform`` if one is passed. (Lightning's own hosted copy takes no transforms; it
    accepts and drops them.)
    """

    RESOURCES = ("https://pl-public-data.s3.amazonaws.com/MNIST/processed/training.pt",
                 "https://pl-public-data.s3.amazonaws.com/MNIST/processed/test.pt")
    TRAIN_FILE_NAME = "training.pt"
    TEST_FILE_NAME = "test.pt"
    cache_folder_name = "complete"

    def __init__(self, root: str, train: bool = True,
                 normalize: tuple[float, float] | None = (0.1307, 0.3081), download: bool = True,
                 transform: Callable | None = None, target_transform: Callable | None = None):
        super().__init__()
        self.root = root
        self.train = train
        self.normalize = normalize
        self.transform, self.target_transform = transform, target_transform
        self.prepare_data(download)
        name = self.TRAIN_FILE_NAME if train else self.TEST_FILE_NAME
        self.data, self.targets = torch.load(Path(self.cached_folder_path) / name)

    @property
    def cached_folder_path(self) -> str:
        return os.path.join(self.root, "MNIST", self.cache_folder_name)

    def _missing(self) -> list[str]:
        return [url for url in self.RESOURCES
                if not (Path(self.cached_folder_path) / Path(url).name).is_file()]

    def prepare_data(self, download: bool = True) -> None:
        """Download the files that are not in :attr:`cached_folder_path` (see the class)."""
        missing = self._missing()
        if missing and not download:
            folder = Path(self.cached_folder_path).resolve()
            raise DataUnavailableError(
                f"MNIST(download=False) finds no {', '.join(Path(u).name for u in missing)} in "
                f"{folder}. Pass download=True to fetch {' and '.join(missing)}, or put the "
                f"files in that folder yourself.")
        for url in missing:
            fetch(url, Path(self.cached_folder_path) / Path(url).name)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image = self.data[index].float().unsqueeze(0)
        if self.normalize is not None and len(self.normalize) == 2:
            image = self.normalize_tensor(image, *self.normalize)
        target = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __len__(self) -> int:
        return len(self.data)

    @staticmethod
    def normalize_tensor(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
        """``(tensor - mean) / std``."""
        return (tensor - mean) / std


def _torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def MNIST(*args: Any, **kwargs: Any) -> Dataset:
    """An MNIST data set: ``torchvision.datasets.MNIST(*args, **kwargs)`` when torchvision is
    installed and ``PL_USE_MOCKED_MNIST`` is not set, else ``HostedMNIST(*args, **kwargs)``.
    The arguments are those of the class chosen (both take ``root``, ``train``, ``download``,
    ``transform``); torchvision's does not download unless ``download=True``."""
    if _torchvision_available() and not os.environ.get("PL_USE_MOCKED_MNIST"):
        from torchvision.datasets import MNIST as TorchvisionMNIST

        return TorchvisionMNIST(*args, **kwargs)
    return HostedMNIST(*args, **kwargs)


class MNISTDataModule(LightningDataModule):
    """MNIST in three parts: the 60,000 training images less ``val_split`` for training (read
    shuffled), those ``val_split`` images for validation, and the 10,000 test images. The split
    is drawn from a generator seeded with ``seed``. Every loader has ``batch_size``,
    ``num_workers`` (0 on Windows, with a warning), ``drop_last=True`` and pinned memory.

    With torchvision installed the images are tensors in [0, 1] (``ToTensor``), and with
    ``normalize=True`` shifted to [-1, 1]; without it they come from :class:`HostedMNIST`
    (normalised by MNIST's mean and deviation). ``prepare_data`` downloads both sets to
    ``data_dir``.
    """

    name = "mnist"

    def __init__(self, data_dir: str = _DATASETS_PATH, val_split: int = 5000,
                 num_workers: int = 16, normalize: bool = False, seed: int = 42,
                 batch_size: int = 32) -> None:
        super().__init__()
        if num_workers and sys.platform == "win32":
            warnings.warn(f"MNISTDataModule(num_workers={num_workers}): worker processes are "
                          f"slow to start on Windows, so the loaders use num_workers=0 "
                          f"instead.", stacklevel=2)
            num_workers = 0
        self.data_dir = data_dir
        self.val_split = val_split
        self.num_workers = num_workers
        self.normalize = normalize
        self.seed = seed
        self.batch_size = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def prepare_data(self) -> None:
        MNIST(self.data_dir, train=True, download=True)
        MNIST(self.data_dir, train=False, download=True)

    def _dataset(self, train: bool) -> Dataset:
        transform = self.default_transforms
        extra = {"transform": transform} if transform is not None else {}
        return MNIST(self.data_dir, train=train, download=False, **extra)

    def setup(self, stage: str) -> None:
        dataset = self._dataset(train=True)
        self.dataset_train, self.dataset_val = random_split(
            dataset, [len(dataset) - self.val_split, self.val_split],
            generator=torch.Generator().manual_seed(self.seed))

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle,
                          num_workers=self.num_workers, drop_last=True, pin_memory=True)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.dataset_train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.dataset_val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._dataset(train=False), shuffle=False)

    @property
    def default_transforms(self) -> Callable | None:
        """torchvision's ``ToTensor`` (then ``Normalize((0.5,), (0.5,))`` when ``normalize``),
        or ``None`` without torchvision."""
        if not _torchvision_available():
            return None
        from torchvision import transforms

        if self.normalize:
            return transforms.Compose([transforms.ToTensor(),
                                       transforms.Normalize(mean=(0.5,), std=(0.5,))])
        return transforms.ToTensor()
