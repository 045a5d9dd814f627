"""The submodules of ``ptrain.lightning.callbacks``, named as Lightning's
(``lightning.pytorch.callbacks.progress``, ``.finetuning``, ``.timer``, ...).
``ptrain/lightning/callbacks.py`` is a module, not a package; its ``__path__`` points here, so
``import ptrain.lightning.callbacks.progress`` finds ``progress.py``."""
