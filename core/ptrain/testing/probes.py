"""Callbacks the conformance suites add to their runs to see what a plugin did.

They live in an importable module so that they can be pickled to the worker processes of a
multi-process strategy; what they see there they write to files (global rank 0, or one file
per rank), which the suite reads in the launching process.
"""

from __future__ import annotations

import copy
import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ptrain.hookspecs import PROJECT_NAME, hookimpl

_IMPL_MARK = f"{PROJECT_NAME}_impl"

RESUME_CHECKPOINT = "resume.ckpt"  # the copy of last.ckpt as written at the end of epoch 0
SAVED_STATE = "saved_state.pt"  # what the checkpoint held for the plugin under test
LOADED_STATE = "loaded_state.pt"  # the plugin's state_dict() after a resume restored it


def call_own_hook(plugin: Any, hook: str, **available: Any) -> tuple[bool, Any]:
    """Call ``plugin``'s own implementation of ``hook`` with the arguments it declares:
    ``(True, result)``, or ``(False, None)`` when it implements no such hook."""
    function = _own_implementation(plugin, hook)
    if function is None:
        return False, None
    wanted = inspect.signature(function).parameters
    return True, function(**{k: v for k, v in available.items() if k in wanted})


def _own_implementation(plugin: Any, hook: str) -> Any:
    """The method of ``plugin`` that implements ``hook``: named after it, or another name with
    ``specname=hook`` (as a plugin does whose ``state_dict`` is another API's method)."""
    function = getattr(plugin, hook, None)
    if function is not None and hasattr(function, _IMPL_MARK) \
            and getattr(function, _IMPL_MARK).get("specname") in (None, hook):
        return function
    for name in dir(type(plugin)):
        candidate = getattr(type(plugin), name, None)
        options = getattr(candidate, _IMPL_MARK, None)
        if callable(candidate) and isinstance(options, dict) \
                and options.get("specname") == hook:
            return getattr(plugin, name)
    return None


class ResumeProbe:
    """Watches the plugin named ``plugin`` across a checkpoint and a resume.

    In a first run it keeps what the checkpoint written at the end of epoch ``save_epoch``
    holds for the plugin (``SAVED_STATE``) and copies that checkpoint (file or folder of shards)
    to ``out_dir/RESUME_CHECKPOINT``. In a resumed run (``capture_loaded=True``) it records the
    plugin's ``state_dict()`` once the resumed run is set up, just before its first epoch
    (``LOADED_STATE``). Every process writes its ranks to ``out_dir/rank<N>.json``.
    """

    name = "conformance-resume-probe"

    def __init__(self, plugin: str, out_dir: str, save_epoch: int = 0,
                 capture_loaded: bool = False):
        self.plugin, self.out_dir = plugin, out_dir
        self.save_epoch, self.capture_loaded = save_epoch, capture_loaded
        self.saved: dict[str, Any] | None = None

    # the outermost wrapper: what follows its yield runs after every other setup, wrappers'
    # included (a plugin may finish restoring its state there)
    @hookimpl(wrapper=True, tryfirst=True)
    def setup(self, trainer, stage: str):
        result = yield
        out = Path(self.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        ranks = {"global_rank": trainer.global_rank, "local_rank": trainer.local_rank,
                 "world_size": trainer.world_size, "device": str(trainer.device)}
        (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(ranks))
        if self.capture_loaded and trainer.is_global_zero:
            plugin = trainer.plugins[self.plugin]
            has, state = call_own_hook(plugin, "state_dict", trainer=trainer)
            torch.save({"has_state_dict": has, "state": state}, out / LOADED_STATE)
        return result

    @hookimpl
    def save_checkpoint(self, trainer, checkpoint: dict[str, Any], path: str) -> None:
        if (trainer.current_epoch == self.save_epoch
                and Path(path) == Path(trainer.last_checkpoint_path)):
            plugins = checkpoint.get("plugins", {})
            self.saved = {"present": self.plugin in plugins,
                          "state": copy.deepcopy(plugins.get(self.plugin))}

    @hookimpl(trylast=True)  # after the checkpoint callback wrote last.ckpt (and its barrier)
    def on_epoch_end(self, trainer) -> None:
        if trainer.current_epoch != self.save_epoch or not trainer.is_global_zero:
            return
        out = Path(self.out_dir)
        source = Path(trainer.last_checkpoint_path)
        if source.is_dir():
            shutil.copytree(source, out / RESUME_CHECKPOINT, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copyfile(source, out / RESUME_CHECKPOINT)
        if self.saved is not None:
            torch.save(self.saved, out / SAVED_STATE)


class StepProbe:
    """Records, per training step, where the batch the model step sees lives and the state of
    the gradients when the optimizer is about to step (after any unscaling)."""

    name = "conformance-step-probe"

    def __init__(self) -> None:
        self.batch_devices: set[str] = set()
        self.param_devices: set[str] = set()
        self.param_dtypes: set[torch.dtype] = set()
        self.missing_grads: list[list[str]] = []  # per optimizer step
        self.finite: list[torch.Tensor] = []  # per optimizer step: one bool per parameter
        self.names: list[str] = []

    @hookimpl(wrapper=True)
    def model_step(self, trainer, batch: Any):
        _collect_devices(batch, self.batch_devices)
        self.param_devices.update(str(p.device) for p in trainer.module.parameters())
        return (yield)

    @hookimpl
    def on_before_optimizer_step(self, trainer) -> None:
        trainable = [(n, p) for n, p in trainer.module.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in trainable]
        self.param_dtypes.update(p.dtype for _, p in trainable)
        self.missing_grads.append([n for n, p in trainable if p.grad is None])
        flags = [torch.isfinite(p.grad).all() for _, p in trainable if p.grad is not None]
        # kept on the device and looked at after the run: no host sync per step
        self.finite.append(torch.stack(flags) if flags else torch.ones(0, dtype=torch.bool))

    def finite_per_step(self) -> list[list[bool]]:
        return [flags.cpu().tolist() for flags in self.finite]


def _collect_devices(value: Any, into: set[str]) -> None:
    if isinstance(value, torch.Tensor):
        into.add(str(value.device))
    elif isinstance(value, dict):
        for item in value.values():
            _collect_devices(item, into)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_devices(item, into)
