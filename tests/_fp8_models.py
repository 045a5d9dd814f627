"""Models for tests/plugins/precision/test_fp8_mixed.py: the worked decoder of
``examples/decoder.py``, recording what each process computed.

Every training step appends ``{"loss", "float8_layers", "float8_tensor_parallel"}`` (a JSON
line) to ``<record_dir>/rank<R>.jsonl``: the step's loss, how many of the module's layers are
torchao float8 layers, and how many of those a tensor-parallel plan split (their weight is a
DTensor over a ``tp`` mesh dimension), so that a test sees both the numbers and that the
conversion reached the process that trained."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from examples.decoder import Decoder
from ptrain.testing import TinyModule


class RecordedDecoder(Decoder):
    """The decoder, recording each step's loss and float8 layers under ``record_dir``; with
    ``validates``, validated on its training data after each epoch."""

    def __init__(self, record_dir: str = "", validates: bool = False, **kwargs):
        kwargs.setdefault("build", "init")
        super().__init__(**kwargs)
        self.record_dir, self.validates = record_dir, validates

    def val_dataloader(self):
        return self.train_dataloader() if self.validates else None

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.record_dir:
            rank = dist.get_rank() if dist.is_initialized() else 0
            float8 = [m for m in self.modules() if type(m).__name__ == "Float8Linear"]
            split = sum("tp" in (getattr(m.weight, "device_mesh", None) and
                                 m.weight.device_mesh.mesh_dim_names or ()) for m in float8)
            with open(Path(self.record_dir) / f"rank{rank}.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"loss": loss.item(), "float8_layers": len(float8),
                                    "float8_tensor_parallel": split}) + "\n")
        return loss


    def validation_step(self, batch, batch_idx):
        tokens, targets = batch
        loss = F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())
        self.log("val_loss", loss)


class PlannedDecoder(RecordedDecoder):
    """The decoder whose ``configure_model`` applies a plan in a way fp8-mixed refuses:
    ``how="torch"``, the worked plan with torch's ``parallelize_module`` itself (the layers
    would be converted after their plan); ``"lone-layer"``, ``self.parallelize`` given a layer
    fp8-mixed converts, rather than its parent and a path; ``"unattached"``, given a block not
    yet a part of the model; ``"late"``, a Linear layer made after the first plan."""

    def __init__(self, how: str = "torch", **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def configure_model(self):
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

        if self.layers is None:
            self._make_layers()
        tp = self.device_mesh["tp"]
        if self.how == "torch":
            for block in self.layers:
                parallelize_module(block, tp, self.block_plan())
        elif self.how == "lone-layer":
            self.parallelize(self.layers[1].attention.wk, tp, ColwiseParallel())
        elif self.how == "unattached":
            self.parallelize(type(self.layers[0])(self.hparams.dim, self.hparams.heads,
                                                  self.hparams.hidden), tp, self.block_plan())
        else:  # "late": a layer made after the first plan
            self.parallelize(self.layers[0], tp, self.block_plan())
            self.extra = nn.Linear(self.hparams.dim, self.hparams.dim)
            self.parallelize(self.layers[1], tp, self.block_plan())


def read(record_dir: Path, rank: int = 0) -> list[dict]:
    """The lines rank ``rank`` recorded, in order."""
    path = Path(record_dir) / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class Float8SizedTinyModule(TinyModule):
    """The conformance suite's TinyModule with 16 features and 16 hidden units: its first
    layer is one float8 matmuls take (its output layer, 16 x 1, is not)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("features", 16)
        kwargs.setdefault("hidden", 16)
        super().__init__(**kwargs)
