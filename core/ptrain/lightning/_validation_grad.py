"""Lightning's autograd mode for the validation inside ``fit`` (:class:`FitValidationNoGrad`)."""

from __future__ import annotations

from typing import Any

from ptrain.hookspecs import hookimpl


class FitValidationNoGrad:
    """The ptrain callback (in every ``ptrain.lightning.Trainer`` run) that makes the
    validation passes of ``fit``, the sanity check included, run under ``torch.no_grad`` rather
    than ``torch.inference_mode``, as Lightning's fit loop does whatever ``inference_mode``
    says; ``inference_mode`` then applies to ``validate``, ``test`` and ``predict`` only, as in
    Lightning. A ``validation_step`` that turns gradients back on (``torch.enable_grad()``,
    ``torch.set_grad_enabled(True)``: the UvA course's ProtoMAML adapts a copy of its network
    with a few optimizer steps there) needs it: tensors made in inference mode never record
    autograd. ptrain's own ``Trainer`` evaluates under inference mode in ``fit`` too."""

    name = "lightning-fit-validation-no-grad"

    def __init__(self) -> None:
        self._given: bool | None = None

    @hookimpl
    def on_stage_start(self, trainer: Any, stage: str) -> None:
        if stage == "fit":
            self._given, trainer.inference_mode = trainer.inference_mode, False

    @hookimpl
    def teardown(self, trainer: Any, stage: str) -> None:
        if stage == "fit" and self._given is not None:
            trainer.inference_mode, self._given = self._given, None
