"""Whether the state a checkpoint would hold is finite: the module's parameters and every
optimizer's floating-point state.

A step whose loss is finite can still leave NaN weights (a NaN gradient from one op, an
overflow in the optimizer's update). The loss check can't see that, so the trainer also checks
the state at its check points (where it checks the losses: every ``log_every_n_steps`` steps,
after a validation, at an epoch's end) and before every checkpoint, so that a non-finite state
never replaces a finite checkpoint. A check is one ``aminmax`` per tensor (a tensor is finite when
its least and greatest values are: both reductions carry NaN through, and an infinity is one of
them), about ten times faster than ``isfinite().all()``, which allocates a mask as large as the
tensor; the flags are stacked and reduced on the device, and the host reads the one flag with the
values it reads there anyway.
Under a sharding strategy each process checks its own shards (a DTensor's local part); the
flag is reduced across processes by the caller. Naming the tensor that went bad happens only
after a check failed.

An asynchronous save in a single process checks the host copies it writes instead, on the
background writer's thread (:func:`copy_check`), so that the check costs the training step
nothing; a copy found non-finite is not written, and the save's error reaches the training
thread at the next step boundary. Where the files hold something made from the state instead
of copies of it, the state itself is checked, on the training thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

import torch

from ptrain.background_write import copy_key
from ptrain.errors import NonFiniteStateError

if TYPE_CHECKING:
    from ptrain.trainer import Trainer


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor: this process's shard
    return to_local() if to_local is not None else tensor


def _live(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose ``state`` is updated by ``step()``. A wrapper that steps an inner
    optimizer and exposes it as ``optim`` (torch's ``ZeroRedundancyOptimizer``: each rank's
    shard) keeps in its own ``state`` only what was last loaded, with None for the other ranks'
    parameters."""
    inner = getattr(optimizer, "optim", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def _state_tensors(trainer: Trainer, optimizers: bool = True
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and (with ``optimizers``) optimizer state tensor."""
    names = {}
    for name, parameter in trainer.module.named_parameters():
        names[id(parameter)] = name
        yield f"parameter {name!r}", parameter.detach()
    for index, optimizer in enumerate(trainer.optimizers if optimizers else ()):
        for parameter, state in getattr(_live(optimizer), "state", {}).items():
            if not isinstance(state, Mapping):
                continue
            owner = names.get(id(parameter), "a parameter outside the module")
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    yield f"optimizer {index}'s {key!r} of {owner!r}", value


def optimized_tensors(trainer: Trainer) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of what only an optimizer step changes: every parameter an optimizer
    holds, and every tensor of its state; a DTensor's local part."""
    names = {id(parameter): name for name, parameter in trainer.module.named_parameters()}
    for index, optimizer in enumerate(trainer.optimizers):
        live = _live(optimizer)
        for group in live.param_groups:
            for parameter in group["params"]:
                yield (f"parameter {names.get(id(parameter), '(outside the module)')!r}",
                       _local(parameter.detach()))
        for parameter, state in live.state.items():
            if isinstance(state, Mapping):
                owner = names.get(id(parameter), "a parameter outside the module")
                for key, value in state.items():
                    if isinstance(value, torch.Tensor):
                        yield f"optimizer {index}'s {key!r} of {owner!r}", _local(value)


def _checked(tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in tensors:
        local = _local(tensor)
        if local.is_floating_point() and local.device.type != "meta" and local.numel():
            yield name, local


def all_finite(tensors: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A 0-dim bool tensor on ``device``: whether every element of ``tensors`` is finite. No
    host sync."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_device.setdefault(tensor.device, []).append(
            torch.isfinite(torch.stack(torch.aminmax(tensor))).all())
    finite = torch.ones((), dtype=torch.bool, device=device)
    for flags in by_device.values():
        finite = finite & torch.stack(flags).all().to(device)
    return finite


def state_is_finite(trainer: Trainer) -> torch.Tensor:
    """A 0-dim bool tensor on ``trainer.device``: whether every parameter and optimizer state
    tensor of this process is finite. No host sync."""
    return all_finite((tensor for _, tensor in _checked(_state_tensors(trainer))),
                      trainer.device)


def _first_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first tensor of ``named`` that is not finite (a host sync per tensor)."""
    for name, tensor in named:
        if not bool(torch.isfinite(tensor).all()):
            return name
    return None


def first_nonfinite(trainer: Trainer) -> str | None:
    """The name of this process's first non-finite state tensor (a host sync per tensor: call
    it only after a check failed)."""
    return _first_nonfinite(_checked(_state_tensors(trainer)))


def last_written_checkpoint(trainer: Trainer) -> Path | None:
    """The run's resumable checkpoint when one was written, for the messages that say it is
    kept."""
    saved = trainer.last_checkpoint_path if trainer.log_dir is not None else None
    return saved if saved is not None and saved.exists() else None


def state_error(trainer: Trainer) -> NonFiniteStateError:
    """The error for a state found non-finite at ``trainer.global_step``: the step range it went
    bad in (since the last check found it finite), the tensor, and the checkpoint kept."""
    return state_error_for(trainer)(first_nonfinite(trainer))


def state_error_for(trainer: Trainer) -> Callable[[str | None], NonFiniteStateError]:
    """:func:`state_error` in two parts: what it says of the steps and of the checkpoint kept is
    taken now; the function returned makes the error from the first non-finite tensor's name
    (``None``: in another process's shard)."""
    since, step = trainer.finite_state_step, trainer.global_step
    when = (f"after global step {since} (the last check found it finite) and by step {step}"
            if since is not None and since < step else f"at global step {step}")
    saved = last_written_checkpoint(trainer)
    kept = (f"The last checkpoint written, {str(saved)!r}, holds the state from before and is "
            f"kept." if saved is not None else "No checkpoint was written over.")
    hint = trainer.precision_policy.non_finite_hint  # a cause the precision is known for

    def error(tensor: str | None) -> NonFiniteStateError:
        which = f" (first: {tensor})" if tensor is not None else " (in another process's shard)"
        return NonFiniteStateError(
            f"the model's parameters or optimizer state became NaN or infinite {when}{which}, "
            f"though the training loss stayed finite: a step produced non-finite gradients or "
            f"updates. Training stopped and nothing non-finite was saved. {kept} Lower the "
            f"learning rate, clip gradients (--gradient-clip-val), or look for an operation "
            f"that overflows (--detect-anomaly names the first one that makes a NaN in "
            f"backward)." + (f" {hint}" if hint else ""))

    return error


def copy_check(trainer: Trainer, copies: Mapping[tuple, tuple[torch.Tensor, torch.Tensor]],
               copied: Mapping[tuple, tuple[torch.Tensor, torch.Tensor]], weights_only: bool
               ) -> Callable[[], None] | None:
    """The check of an asynchronous save in a single process, to run on the background
    writer's thread before its files: that the host copies in ``copies`` (this save's part of
    a :class:`~ptrain.background_write.BackgroundWrite`'s memo: original and copy by
    :func:`~ptrain.background_write.copy_key`) of this process's parameters and optimizer
    state tensors are finite. It raises :class:`NonFiniteStateError` naming the first that is
    not.

    ``None`` where a tensor the save holds (every parameter, and unless ``weights_only``
    every optimizer state tensor) has no copy in ``copied`` (the write's whole memo: what an
    earlier part at the same step copied, that part's check covers): the strategy wrote
    something made from it instead (a plugin that stores the weights cast to bfloat16), so a
    check of the copies would not vouch for the files, and the caller checks the state
    itself (:func:`check_state_finite`)."""
    state = [(name, copy_key(tensor))
             for name, tensor in _checked(_state_tensors(trainer, optimizers=not weights_only))]
    if any(key not in copied for _, key in state):
        return None
    named = [(name, copies[key][1]) for name, key in state if key in copies]
    error = state_error_for(trainer)

    def check() -> None:
        if not bool(all_finite((copy for _, copy in named), torch.device("cpu"))):
            raise error(_first_nonfinite(named))

    return check


def check_state_finite(trainer: Trainer) -> None:
    """Raise :class:`NonFiniteStateError` if any process's state is not finite (a collective
    under several processes: call it on every process, as ``save_checkpoint`` is); record the
    step as checked otherwise."""
    finite = state_is_finite(trainer)
    if trainer.world_size > 1:
        bad = (~finite).to(torch.float32)
        bad = trainer.hook.reduce_metrics(trainer=trainer, metrics={"bad": bad}, op="max")["bad"]
        finite = bad == 0
    if not bool(finite):
        raise state_error(trainer)
    trainer.finite_state_step = trainer.global_step
