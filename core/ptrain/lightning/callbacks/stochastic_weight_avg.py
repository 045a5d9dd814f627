"""``lightning.pytorch.callbacks.stochastic_weight_avg``: ``StochasticWeightAveraging``,
refused when made."""

from __future__ import annotations

from typing import Any

from ptrain.errors import ConfigError
from ptrain.hook_methods import Callback


class StochasticWeightAveraging(Callback):
    """Lightning's ``StochasticWeightAveraging``: refused when made. It replaces the run's
    learning-rate schedulers with ``SWALR`` part-way through ``fit`` and adds a pass over the
    training data to recompute batch norm statistics; ptrain's loop fixes its schedulers when
    ``fit`` starts and has no such extra pass, so it would silently train differently."""

    def __init__(self, swa_lrs: Any = None, swa_epoch_start: Any = 0.8,
                 annealing_epochs: int = 10, annealing_strategy: str = "cos",
                 avg_fn: Any = None, device: Any = "cpu") -> None:
        raise ConfigError(
            "StochasticWeightAveraging is not supported by ptrain: it swaps the run's "
            "learning-rate schedulers for SWALR part-way through fit and adds a pass over the "
            "training data for the batch norm statistics, which ptrain's loop does not allow "
            "from a callback. Average the weights with WeightAveraging(multi_avg_fn="
            "torch.optim.swa_utils.get_swa_multi_avg_fn()) (or EMAWeightAveraging), return "
            "torch.optim.swa_utils.SWALR from configure_optimizers for the learning rate, and "
            "call torch.optim.swa_utils.update_bn after fit when the model has batch norm.")


__all__ = ["StochasticWeightAveraging"]
