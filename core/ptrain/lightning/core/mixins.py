"""``lightning.pytorch.core.mixins``: ``HyperparametersMixin`` is ptrain's
:class:`~ptrain.hyperparameters.HyperParametersMixin` (``save_hyperparameters``, ``hparams``,
``hparams_initial``), which :class:`ptrain.TrainModule` and :class:`ptrain.DataModule` have;
a class of your own gets them by inheriting it."""

from ptrain.hyperparameters import HyperParametersMixin as HyperparametersMixin

__all__ = ["HyperparametersMixin"]
