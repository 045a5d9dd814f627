"""``WandbLogger`` with Lightning's arguments, over the ``ptrain-wandb`` plugin."""

from __future__ import annotations

from typing import Any

from ptrain_wandb import WandbLogger as _WandbLogger

from ptrain.lightning._common import refuse, refuse_unless


class WandbLogger(_WandbLogger):
    """Lightning's ``WandbLogger``: ``offline=True`` is W&B's offline mode, files go under
    ``dir`` (else ``save_dir``); ``tags`` and ``mode`` may come as extra keyword arguments as
    Lightning passes them to ``wandb.init``. One W&B run per stage."""

    def __init__(self, name: str | None = None, save_dir: Any = ".", version: str | None = None,
                 offline: bool = False, dir: Any = None, id: str | None = None,
                 anonymous: bool | None = None, project: str | None = None,
                 log_model: Any = False, experiment: Any = None, prefix: str = "",
                 checkpoint_name: str | None = None, add_file_policy: str = "mutable",
                 **kwargs: Any):
        refuse_unless("WandbLogger", locals(), {
            "version": (None, "ptrain starts one W&B run per stage"),
            "id": (None, "ptrain starts one W&B run per stage"),
            "anonymous": (None, "set WANDB_ANONYMOUS in the environment"),
            "log_model": (False, "log the checkpoint as an artifact yourself after fit()"),
            "experiment": (None, "ptrain starts the W&B run itself"),
            "prefix": ("", "add the prefix to the names in self.log"),
            "checkpoint_name": (None, "checkpoints are not uploaded"),
            "add_file_policy": ("mutable", "checkpoints are not uploaded"),
        })
        tags = kwargs.pop("tags", None)
        mode = kwargs.pop("mode", "offline" if offline else None)
        if kwargs:
            argument = next(iter(kwargs))
            raise refuse("WandbLogger", argument, kwargs[argument],
                         "pass other wandb.init settings through the WANDB_* environment "
                         "variables")
        super().__init__(project=project, name=name, mode=mode, dir=str(dir or save_dir),
                         tags=tags)
