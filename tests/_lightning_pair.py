"""What the tests that run one program under Lightning and under ``ptrain.lightning`` share."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

FRAMEWORKS = ("lightning.pytorch", "ptrain.lightning")
QUIET = dict(enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")


class Numbers(Dataset):
    """``n`` rows of 4 features, the same in every process and framework."""

    def __init__(self, n: int, seed: int = 0):
        self.rows = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rows[index]
