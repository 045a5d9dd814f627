"""Lightning's names over ptrain: a program written against ``lightning.pytorch`` (or
``pytorch_lightning``) runs when those words in its import lines are replaced by
``ptrain.lightning``.

This package holds names and thin adapters only: ``LightningModule`` *is*
:class:`ptrain.TrainModule` and ``LightningDataModule`` *is* :class:`ptrain.DataModule`;
:class:`Trainer` takes Lightning's arguments and turns them into ptrain's options (each one either
works or is refused with a message saying what to do; none is ignored). Everything they do lives
in the native API, so a native ptrain program has it too. ``docs/from-lightning.md`` lists each
name, its native form and every deliberate difference.
"""

from ptrain.hook_methods import Callback
from ptrain.lightning._logo import LIGHTNING_LOGO, cli_lightning_logo
from ptrain.lightning.trainer import Trainer
from ptrain.module import DataModule as LightningDataModule
from ptrain.module import TrainModule as LightningModule
from ptrain.trainer import seed_everything

#: The version of Lightning's API this layer follows, for programs and libraries that check
#: ``lightning.pytorch.__version__`` before using a feature; ptrain's own is ``ptrain.__version__``.
__version__ = "2.6.6"

__all__ = ["Callback", "LightningDataModule", "LightningModule", "Trainer", "seed_everything"]
