"""``MNIST`` as torchvision's reads ``ROOT/MNIST/raw`` (the idx files), items as PIL images."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def _read_idx(path: Path) -> np.ndarray:
    data = path.read_bytes()
    ndim = data[3]
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


class MNIST(torch.utils.data.Dataset):
    """Images (28x28, mode ``L``) and integer labels; ``download=True`` only checks that the
    files are there (nothing is fetched)."""

    def __init__(self, root, train: bool = True, transform=None, target_transform=None,
                 download: bool = False):
        raw = Path(root) / "MNIST" / "raw"
        prefix = "train" if train else "t10k"
        images = raw / f"{prefix}-images-idx3-ubyte"
        if not images.exists():
            raise RuntimeError(f"MNIST stand-in: {images} is missing (data.py makes it; "
                               "nothing is downloaded)")
        self.data = torch.from_numpy(_read_idx(images).copy())
        self.targets = torch.from_numpy(
            _read_idx(raw / f"{prefix}-labels-idx1-ubyte").astype(np.int64))
        self.transform, self.target_transform = transform, target_transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index):
        image = Image.fromarray(self.data[index].numpy(), mode="L")
        target = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
