"""The ``tensorboard`` callback: writes every published metric as a TensorBoard scalar.

Events go to the run folder (``<default_root_dir>/version_N``), so ``tensorboard --logdir runs``
shows each run. Only global rank 0 writes.
"""

from __future__ import annotations

from ptrain.hookspecs import hookimpl


class TensorBoardLogger:
    name = "tensorboard"  # its entry point's name, also when given as an object

    def __init__(self) -> None:
        self.writer = None

    @hookimpl
    def setup(self, trainer) -> None:
        if trainer.is_global_zero and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(trainer.log_dir))

    @hookimpl
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for name, value in metrics.items():
                self.writer.add_scalar(name, value, global_step=step)

    @hookimpl
    def on_epoch_end(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    @hookimpl
    def teardown(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
