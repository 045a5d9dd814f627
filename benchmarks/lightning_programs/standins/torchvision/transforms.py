"""``Compose``, ``ToTensor`` and ``Normalize`` with torchvision's results on grey and RGB
images."""

from __future__ import annotations

import numpy as np
import torch


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for transform in self.transforms:
            x = transform(x)
        return x


class ToTensor:
    """A PIL image or an HxW(xC) uint8 array as a float CxHxW tensor in [0, 1]."""

    def __call__(self, picture):
        array = np.array(picture, copy=True)
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(array).permute(2, 0, 1).contiguous()
        return tensor.float().div(255) if array.dtype == np.uint8 else tensor.float()


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, tensor):
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std
