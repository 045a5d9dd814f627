"""Giving a model created on the ``meta`` device its memory and its initial values.

A sharding strategy has the module's layers created on the meta device (shapes and dtypes,
no memory; see the ``module_init_context`` hook), shards them, and then calls
:func:`materialize` on the wrapped model: every rank allocates only its own shards, and every
parameter gets the value it would have had if the model had been built whole on the CPU.

How the values come about: each module that holds parameters or buffers of its own must have
a ``reset_parameters()`` that (re)initialises them, as torch's layers do (``nn.Linear``,
``nn.Embedding``, ``nn.LayerNorm``, ...). The modules are taken in ``model.modules()`` order
(the order they were assigned in), one at a time: the module's own tensors are swapped for
whole, empty CPU tensors, its ``reset_parameters()`` fills them, drawing from the CPU random
generator exactly as the constructor did, and each rank copies its part into its shard; then
the whole tensors are dropped. So no rank holds more than its shards plus one module's tensors,
and with the same seed the weights equal those of the model built whole, as long as the layers
were assigned in the order they were created. Every rank draws the same numbers: before
starting, rank 0's CPU generator state is given to all ranks.

A ``reset_parameters()`` may fill its tensors in place or assign new ones of the same shape
(``self.freqs = compute()``); either gives the values. A module holding tensors of its own
without a ``reset_parameters()`` is a :class:`ModelError` naming it: its values would
otherwise be whatever the memory held.
"""

from __future__ import annotations

import torch
from torch import nn

from ptrain.errors import ModelError


def has_meta_tensors(model: nn.Module) -> bool:
    return any(t.is_meta for t in _local_tensors(model))


def materialize(model: nn.Module, device: torch.device) -> None:
    """Give the meta tensors of ``model`` memory on ``device`` and their initial values (see
    the module docstring); tensors not on the meta device keep their values.

    ``model`` may be sharded (FSDP2): its parameters are then DTensors, and each rank fills
    only its local shard. Under a process group every rank must call this (the generator state
    is shared).
    """
    uninitialised = [(name, m, _meta_names(m)) for name, m in model.named_modules()]
    uninitialised = [entry for entry in uninitialised if entry[2]]
    if not uninitialised:
        return
    missing = [f"{name or 'the model'} ({type(m).__qualname__})" for name, m, _ in uninitialised
               if not callable(getattr(m, "reset_parameters", None))]
    if missing:
        raise ModelError(
            f"the model was created on the meta device (configure_model under a sharding "
            f"strategy, or Trainer.init_module), and {', '.join(missing[:3])}"
            f"{' and more' if len(missing) > 3 else ''} holds parameters or buffers of its own "
            f"but has no reset_parameters() to give them their initial values. Add a "
            f"reset_parameters(self) that initialises the module's own tensors, or build the "
            f"model whole (Trainer.init_module(empty_init=False), or the strategy's "
            f"empty_init option off).")
    _share_generator_state()
    # to_empty on the root (FSDP2 re-registers its shards there) gives every tensor new memory:
    # the values of those that had some are put back
    kept = {name: _local(t).detach().clone() for name, t in _named_tensors(model)
            if not _local(t).is_meta}
    model.to_empty(device=device, recurse=True)
    with torch.no_grad():
        for name, tensor in _named_tensors(model):
            if name in kept:
                _local(tensor).copy_(kept[name])
    del kept
    for _, module, names in uninitialised:
        _initialise(module, names)


def _meta_names(module: nn.Module) -> set[str]:
    """The keys (``p.NAME``, ``b.NAME``) of ``module``'s own tensors that are on the meta device."""
    own = _own(module)
    return {key for key, tensor in own.items() if _local(tensor).is_meta}


def _own(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**{f"p.{k}": v for k, v in module._parameters.items() if v is not None},
            **{f"b.{k}": v for k, v in module._buffers.items() if v is not None}}


def _initialise(module: nn.Module, meta: set[str]) -> None:
    """Run ``module.reset_parameters()`` on whole CPU stand-ins of its own tensors and copy into
    those that were on the meta device (``meta``) their values, or this rank's part of them."""
    own = _own(module)
    wholes = {}
    for key, tensor in own.items():
        kind, name = key.split(".", 1)
        whole = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
        wholes[key] = whole
        if kind == "p":
            module._parameters[name] = nn.Parameter(whole, requires_grad=tensor.requires_grad)
        else:
            module._buffers[name] = whole
    try:
        with torch.no_grad():
            module.reset_parameters()
        # a reset_parameters() may assign new tensors rather than fill the stand-ins (the
        # tensor-parallel example's root recomputes its rotary buffer): its values are those
        wholes = {key: _reassigned(module, key, whole) for key, whole in wholes.items()}
    finally:
        for key, tensor in own.items():
            kind, name = key.split(".", 1)
            (module._parameters if kind == "p" else module._buffers)[name] = tensor
    with torch.no_grad():
        for key in meta:
            tensor = own[key]
            whole = wholes[key].to(_local(tensor).device)
            if hasattr(tensor, "device_mesh"):  # a DTensor: this rank's part of the whole
                from torch.distributed.tensor import distribute_tensor

                whole = distribute_tensor(whole, tensor.device_mesh, tensor.placements,
                                          src_data_rank=None).to_local()
            _local(tensor).copy_(whole)


def _reassigned(module: nn.Module, key: str, whole: torch.Tensor) -> torch.Tensor:
    """What ``module`` holds under ``key`` after its ``reset_parameters()``: the stand-in
    ``whole``, or the tensor it assigned instead, which must keep the stand-in's shape."""
    kind, name = key.split(".", 1)
    now = (module._parameters if kind == "p" else module._buffers).get(name)
    if now is None or now is whole:
        return whole
    if now.shape != whole.shape:
        raise ModelError(
            f"{type(module).__qualname__}.reset_parameters() replaced its "
            f"{'parameter' if kind == 'p' else 'buffer'} {name!r} of shape "
            f"{tuple(whole.shape)} by one of shape {tuple(now.shape)}; give it the shape the "
            f"constructor gave it (the model was made on the meta device with that shape).")
    return now.detach()


def _share_generator_state() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        state = [torch.get_rng_state()]
        dist.broadcast_object_list(state, src=0)
        torch.set_rng_state(state[0])


def _local_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [_local(t) for t in (*model.parameters(), *model.buffers())]


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


__all__ = ["has_meta_tensors", "materialize"]
