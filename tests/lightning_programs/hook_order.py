"""A custom Callback that records every hook it sees, with a model that overrides the module
hooks too. Run as ``python hook_order.py OUT_DIR``."""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

EVENTS = []
CALLBACK_HOOKS = [
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start",
    "on_sanity_check_end", "on_train_start", "on_train_end", "on_validation_start",
    "on_validation_end", "on_test_start", "on_test_end", "on_train_epoch_start",
    "on_train_epoch_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start",
    "on_test_batch_end", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_before_zero_grad",
]
MODULE_HOOKS = [
    "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_validation_start",
    "on_validation_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_before_backward", "on_after_backward",
]


class Recorder(Callback):
    """Records every hook it sees; at each teardown, appends what it saw since the last one to
    ``events-rank<R>.jsonl`` (so the events of every process and stage end up on disk)."""

    def __init__(self, out):
        self.out, self.written = out, 0

    def teardown(self, trainer, pl_module, stage):
        EVENTS.append("cb:teardown")
        path = os.path.join(self.out, f"events-rank{trainer.global_rank}.jsonl")
        with open(path, "a") as f:
            for event in EVENTS[self.written:]:
                f.write(json.dumps(event) + "\n")
        self.written = len(EVENTS)


def _recording(name, prefix):
    def method(self, *args, **kwargs):
        EVENTS.append(prefix + name)
    return method


for _name in CALLBACK_HOOKS:
    if _name != "teardown":
        setattr(Recorder, _name, _recording(_name, "cb:"))


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val", self.layer(batch[0]).mean())

    def test_step(self, batch, batch_idx):
        self.log("test", self.layer(batch[0]).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=2)

    val_dataloader = test_dataloader = train_dataloader


for _name in MODULE_HOOKS:
    setattr(Model, _name, _recording(_name, "m:"))


def main(out: str, precision: str = "32-true", devices: int = 1) -> None:
    pl.seed_everything(0)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=devices, precision=precision,
                         callbacks=[Recorder(os.path.abspath(out))], logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, num_sanity_val_steps=1,
                         limit_val_batches=1)
    model = Model()
    trainer.fit(model)
    trainer.test(model, verbose=False)
    if trainer.is_global_zero:
        with open(os.path.join(out, "events-rank0.jsonl")) as f:
            events = [json.loads(line) for line in f]
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"events": events}, f)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *[int(d) for d in sys.argv[3:4]])
