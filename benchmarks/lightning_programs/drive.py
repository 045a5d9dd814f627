"""Runs one catalogued program's own LightningModule/DataModule under a Trainer the harness
builds, for the comparison settings a program has no option for (ddp on 2 CPU processes,
bf16-mixed, resume from a mid-run checkpoint).

    python drive.py FRAMEWORK PROGRAM_DIR MODULE BUILD_FILE CONFIG [CKPT]

``FRAMEWORK`` is the Lightning package the program imports (``lightning.pytorch`` or
``pytorch_lightning``) or ``ptrain`` (``ptrain.lightning``);
``MODULE`` is the program's file (its import lines already rewritten for ptrain), imported from
``PROGRAM_DIR`` as a module, so its ``__main__`` block does not run. ``BUILD_FILE`` holds the
catalogue's recipe: Python that, given ``P`` (the program's module), ``L`` (the framework's
package) and ``M(name)`` (imports ``L``'s submodule ``name``), sets ``model``, ``trainer``
(Trainer keyword arguments: the program's own settings, kept short), ``fit`` (keyword
arguments of ``fit`` after the model) and ``test`` (those of ``test``, or None); it may set
``ddp_strategy``, the strategy name the ``ddp`` setting uses where plain ``ddp`` does not run
the program under Lightning (a GAN whose steps leave parameters unused needs
``ddp_find_unused_parameters_true``; both frameworks then get that name). ``CONFIG``
adds its settings: ``ddp`` (strategy ddp, 2 CPU devices),
``bf16`` (precision bf16-mixed), ``unbroken`` (the recipe as it is), ``resume1`` (stopped
after its first epoch by ``trainer.should_stop``, then ``save_checkpoint(CKPT)``),
``resume2`` (the full run from ``CKPT``).
"""

from __future__ import annotations

import importlib
import os
import sys

SETTINGS = {
    "ddp": {"strategy": "ddp", "accelerator": "cpu", "devices": 2},
    "bf16": {"precision": "bf16-mixed"},
    "unbroken": {},
    "resume1": {},
    "resume2": {},
}


def main(framework: str, program_dir: str, module: str, build_file: str, config: str,
         ckpt: str | None = None) -> None:
    L = importlib.import_module("ptrain.lightning" if framework == "ptrain" else framework)
    sys.path.insert(0, program_dir)
    os.chdir(program_dir)
    P = importlib.import_module(module)
    space = {"P": P, "L": L,
             "M": lambda name: importlib.import_module(f"{L.__name__}.{name}")}
    with open(build_file) as f:
        exec(compile(f.read(), build_file, "exec"), space)  # noqa: S102 - the catalogue's recipe
    kwargs = {**space["trainer"], **SETTINGS[config]}
    if config == "ddp":
        kwargs["strategy"] = space.get("ddp_strategy", "ddp")
    if config == "resume1":
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), _stop_after_first_epoch(L)]
    trainer = L.Trainer(**kwargs)
    model = space["model"]
    if config == "resume2":
        trainer.fit(model, ckpt_path=ckpt, **space["fit"])
    else:
        trainer.fit(model, **space["fit"])
    if config == "resume1":
        trainer.save_checkpoint(ckpt)
        return
    if space.get("test") is not None:
        trainer.test(model, **space["test"])


def _stop_after_first_epoch(L):
    """A callback that ends the fit after its first epoch (its validation included) the way a
    program stops itself, ``trainer.should_stop``: the Trainer keeps the recipe's
    ``max_epochs``, so whatever the program builds from it (a ``OneCycleLR`` over
    ``trainer.max_epochs``) is what the unbroken run builds."""

    class StopAfterFirstEpoch(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = True

    return StopAfterFirstEpoch()


if __name__ == "__main__":
    main(*sys.argv[1:])
