"""``lightning.pytorch.callbacks.rich_model_summary``: ``RichModelSummary``."""

from __future__ import annotations

from ptrain.lightning.callbacks.model_summary import ModelSummary


class RichModelSummary(ModelSummary):
    """Lightning's ``RichModelSummary``: ptrain's ``model-summary`` table (plain text), as
    :class:`~ptrain.lightning.callbacks.ModelSummary`."""


__all__ = ["RichModelSummary"]
