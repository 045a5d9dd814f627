"""The submodules of ``ptrain.lightning.trainer`` (Lightning's ``lightning.pytorch.trainer.
states`` and ``.trainer``). ``ptrain/lightning/trainer.py`` is a module, not a package; its
``__path__`` points here, so ``import ptrain.lightning.trainer.states`` finds ``states.py``."""
