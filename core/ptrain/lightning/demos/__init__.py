"""``lightning.pytorch.demos``: the small models and data Lightning ships for examples and
tests, over ptrain's classes (``LightningModule`` is :class:`ptrain.TrainModule`).

- :mod:`.boring_classes`: ``BoringModel`` (one ``Linear(32, 2)``), ``BoringDataModule``,
  ``DemoModel``, random data sets and more, for tests that subclass them;
- :mod:`.transformer`: ``Transformer``, ``LightningTransformer`` and ``WikiText2``;
- :mod:`.lstm`: ``SimpleLSTM``, ``LightningLSTM`` and ``SequenceSampler``;
- :mod:`.mnist_datamodule`: ``MNIST`` and ``MNISTDataModule``.

Each keeps Lightning's layers, defaults and order of creation, so a seeded run starts from
Lightning's weights. The data sets download as Lightning's do (into ``./data`` by default), use
files already there, and say where to put the files when there is no network.
"""

from ptrain.lightning.demos.boring_classes import BoringDataModule, BoringModel, DemoModel
from ptrain.lightning.demos.lstm import LightningLSTM, SequenceSampler, SimpleLSTM
from ptrain.lightning.demos.transformer import LightningTransformer, Transformer, WikiText2

__all__ = ["BoringDataModule", "BoringModel", "DemoModel", "LightningLSTM",
           "LightningTransformer", "SequenceSampler", "SimpleLSTM", "Transformer", "WikiText2"]
