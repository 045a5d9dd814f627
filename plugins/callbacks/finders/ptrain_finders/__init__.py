"""ptrain-finders: two callbacks that search before training starts.

- ``lr-finder`` (:class:`LRFinder`): an LR range test; suggests a learning rate, plots the curve,
  and trains with the suggestion (or stops after the test).
- ``batch-size-finder`` (:class:`BatchSizeFinder`): the largest training batch size that fits in
  memory; trains with it (or stops after the search).

Both run real training steps through the run's own hooks in ``setup(stage="fit")`` and then put
the training state back exactly (:class:`TrainingSnapshot`). See README.md for the rules.
"""

from ptrain_finders.batch_size_finder import BatchSizeFinder
from ptrain_finders.lr_finder import LRFinder
from ptrain_finders.snapshot import TrainingSnapshot

__all__ = ["BatchSizeFinder", "LRFinder", "TrainingSnapshot"]
