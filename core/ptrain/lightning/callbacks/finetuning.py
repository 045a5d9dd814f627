"""``lightning.pytorch.callbacks.finetuning``: ``BaseFinetuning`` (freeze modules before
training, unfreeze them into new param groups later) and ``BackboneFinetuning``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Callable, Iterator

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ptrain.errors import ModelError
from ptrain.hookspecs import hookimpl
from ptrain.lightning.callbacks._plugin_callback import PluginCallback
from ptrain.selection import object_name

log = logging.getLogger(__name__)


def multiplicative(epoch: int) -> float:
    """``BackboneFinetuning``'s default ``lambda_func``: the backbone's rate doubles each
    epoch."""
    return 2.0


class BaseFinetuning(PluginCallback):
    """Lightning's ``BaseFinetuning``: override ``freeze_before_training(pl_module)`` (freeze
    what trains later; called before ``configure_optimizers``, so the optimizer can leave the
    frozen parameters out: ``filter(lambda p: p.requires_grad, self.parameters())``) and
    ``finetune_function(pl_module, epoch, optimizer)`` (called at the start of each training
    epoch, for each optimizer: unfreeze with ``unfreeze_and_add_param_group``). The static
    helpers (``freeze``, ``make_trainable``, ``filter_params``, ...) are Lightning's.

    The param groups it added are saved with the checkpoints, and a resumed ``fit`` adds them
    back before the optimizer's state is restored, so it resumes exactly.
    """

    _optimizers_seen = 0  # the optimizers wrap_optimizer saw in this stage

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False

    # -- what a subclass writes ----------------------------------------------------------------

    def freeze_before_training(self, pl_module: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must override freeze_before_training")

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must override finetune_function")

    # -- Lightning's helpers --------------------------------------------------------------------

    @staticmethod
    def flatten_modules(modules: Any) -> list[nn.Module]:
        """The leaf modules of ``modules`` (a module or nested iterables of them), and the
        modules with parameters of their own."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable) and not isinstance(modules, nn.Module):
            return [m for module in modules for m in BaseFinetuning.flatten_modules(module)]
        found = modules.modules() if isinstance(modules, nn.Module) else iter(())
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Any, train_bn: bool = True,
                      requires_grad: bool = True) -> Iterator[nn.Parameter]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (batch
        norm layers' left out unless ``train_bn``)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Any) -> None:
        """Unfreeze ``modules`` (batch norm layers track their statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        """Freeze ``module``'s own parameters (a batch norm layer stops tracking statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Any, train_bn: bool = True) -> None:
        """Freeze ``modules``; with ``train_bn`` their batch norm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Any, params: Iterable[nn.Parameter]) -> list:
        """``params`` without those ``optimizer`` holds already (with a warning naming the
        usual cause)."""
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        kept, skipped = [], 0
        for param in params:
            if id(param) in held:
                skipped += 1
            else:
                kept.append(param)
        if skipped:
            import warnings

            warnings.warn(f"{skipped} parameter(s) to unfreeze are already in the optimizer's "
                          f"param groups and are skipped; build the optimizer over the "
                          f"trainable parameters only: {type(optimizer).__name__}(filter(lambda "
                          f"p: p.requires_grad, self.parameters()), ...).", stacklevel=3)
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(modules: Any, optimizer: Any, lr: float | None = None,
                                     initial_denom_lr: float = 10.0,
                                     train_bn: bool = True) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new param group,
        at ``lr`` (default: the first group's rate divided by ``initial_denom_lr``)."""
        BaseFinetuning.make_trainable(modules)
        rate = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denominator = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        params = BaseFinetuning.filter_on_optimizer(optimizer, params)
        if params:
            optimizer.add_param_group({"params": params, "lr": rate / denominator})

    # -- Lightning's callback methods ------------------------------------------------------

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            before = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._store(pl_module, index, before, optimizer.param_groups)

    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restarting = True
        self._internal_optimizer_metadata = state_dict.get("internal_optimizer_metadata",
                                                           state_dict)

    def _store(self, pl_module: Any, index: int, before: int, groups: list[dict]) -> None:
        names = {p: n for n, p in pl_module.named_parameters()}

        def described(selected: list[dict]) -> list[dict[str, Any]]:
            return [{**{k: v for k, v in g.items() if k != "params"},
                     "params": [names[p] for p in g["params"]]} for g in selected]

        if index not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[index] = described(groups)
        elif before != len(groups):
            self._internal_optimizer_metadata[index].extend(described(groups[before:]))

    # -- ptrain's hooks: before the optimizers are made, and before a resume restores them ----

    @hookimpl(specname="wrap_model", wrapper=True)
    def _freeze_before_optimizers(self, trainer: Any) -> Any:
        self._optimizers_seen = 0
        self.freeze_before_training(trainer.module)
        return (yield)

    @hookimpl(specname="wrap_optimizer", wrapper=True)
    def _groups_of_the_resumed_run(self, trainer: Any, optimizer: Any) -> Any:
        index, self._optimizers_seen = self._optimizers_seen, self._optimizers_seen + 1
        if trainer.ckpt_path is not None:
            saved = self._saved_groups(trainer, index)
            if saved is not None and len(saved) > len(optimizer.param_groups):
                named = dict(trainer.module.named_parameters())
                for group in saved[len(optimizer.param_groups):]:
                    params = [named[name] for name in group["params"]]
                    for param in params:
                        param.requires_grad = True
                    optimizer.add_param_group({**{k: v for k, v in group.items()
                                                  if k != "params"}, "params": params})
        return (yield)

    def _saved_groups(self, trainer: Any, index: int) -> list[dict[str, Any]] | None:
        checkpoint = trainer.hook.load_checkpoint(trainer=trainer, path=trainer.ckpt_path)
        state = checkpoint.get("plugins", {}).get(object_name(self)) or {}
        entry = state.get(self.state_key, {}).get("state") or {}
        return entry.get("internal_optimizer_metadata", {}).get(index)


class BackboneFinetuning(BaseFinetuning):
    """Lightning's ``BackboneFinetuning``: the module's ``backbone`` is frozen until epoch
    ``unfreeze_backbone_at_epoch``, then trained in a new param group starting at
    ``backbone_initial_lr`` (default: the first group's rate x ``backbone_initial_ratio_lr``),
    its rate multiplied by ``lambda_func(epoch + 1)`` at each later epoch (and with
    ``should_align`` never above the first group's)."""

    def __init__(self, unfreeze_backbone_at_epoch: int = 10,
                 lambda_func: Callable[[int], float] = multiplicative,
                 backbone_initial_ratio_lr: float = 10e-2,
                 backbone_initial_lr: float | None = None, should_align: bool = True,
                 initial_denom_lr: float = 10.0, train_bn: bool = True, verbose: bool = False,
                 rounding: int = 12) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def freeze_before_training(self, pl_module: Any) -> None:
        backbone = getattr(pl_module, "backbone", None)
        if not isinstance(backbone, nn.Module):
            raise ModelError(f"BackboneFinetuning needs the module's `backbone` attribute, an "
                             f"nn.Module; {type(pl_module).__name__} has none. Name the part to "
                             f"finetune `self.backbone`, or subclass BaseFinetuning.")
        self.freeze(backbone)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        rate = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = (self.backbone_initial_lr if self.backbone_initial_lr is not None
                           else rate * self.backbone_initial_ratio_lr)
            self.previous_backbone_lr = backbone_lr
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, backbone_lr,
                                              train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        elif epoch > self.unfreeze_backbone_at_epoch:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > rate:
                backbone_lr = rate
            optimizer.param_groups[-1]["lr"] = backbone_lr
            self.previous_backbone_lr = backbone_lr
        else:
            return
        if self.verbose:
            log.info(f"Current lr: {round(rate, self.rounding)}, "
                     f"Backbone lr: {round(backbone_lr, self.rounding)}")


__all__ = ["BackboneFinetuning", "BaseFinetuning"]
