"""``lightning.pytorch.callbacks.lambda_function``: ``LambdaCallback``, a callback made of
functions given by hook name."""

from __future__ import annotations

import itertools
from typing import Any, Callable

from ptrain.hook_methods import Callback

#: Lightning's LambdaCallback arguments, in its order: the callback methods it can be given
HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start",
    "on_sanity_check_end", "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start",
    "on_train_epoch_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_validation_batch_start",
    "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end", "on_train_start",
    "on_train_end", "on_validation_start", "on_validation_end", "on_test_start", "on_test_end",
    "on_exception", "on_save_checkpoint", "on_load_checkpoint", "on_before_backward",
    "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "on_predict_start",
    "on_predict_end", "on_predict_batch_start", "on_predict_batch_end", "on_predict_epoch_start",
    "on_predict_epoch_end",
)
_made = itertools.count()


def _method(function: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return method


class LambdaCallback(Callback):
    """Lightning's ``LambdaCallback``: each function given by a callback method's name is called
    where that method is, with its arguments (``on_train_start=lambda trainer, pl_module:
    ...``). The functions become methods of a class made for this object, since ptrain finds a
    callback's methods on its class."""

    def __init__(self, setup: Callable | None = None, teardown: Callable | None = None,
                 on_fit_start: Callable | None = None, on_fit_end: Callable | None = None,
                 on_sanity_check_start: Callable | None = None,
                 on_sanity_check_end: Callable | None = None,
                 on_train_batch_start: Callable | None = None,
                 on_train_batch_end: Callable | None = None,
                 on_train_epoch_start: Callable | None = None,
                 on_train_epoch_end: Callable | None = None,
                 on_validation_epoch_start: Callable | None = None,
                 on_validation_epoch_end: Callable | None = None,
                 on_test_epoch_start: Callable | None = None,
                 on_test_epoch_end: Callable | None = None,
                 on_validation_batch_start: Callable | None = None,
                 on_validation_batch_end: Callable | None = None,
                 on_test_batch_start: Callable | None = None,
                 on_test_batch_end: Callable | None = None,
                 on_train_start: Callable | None = None, on_train_end: Callable | None = None,
                 on_validation_start: Callable | None = None,
                 on_validation_end: Callable | None = None,
                 on_test_start: Callable | None = None, on_test_end: Callable | None = None,
                 on_exception: Callable | None = None,
                 on_save_checkpoint: Callable | None = None,
                 on_load_checkpoint: Callable | None = None,
                 on_before_backward: Callable | None = None,
                 on_after_backward: Callable | None = None,
                 on_before_optimizer_step: Callable | None = None,
                 on_before_zero_grad: Callable | None = None,
                 on_predict_start: Callable | None = None, on_predict_end: Callable | None = None,
                 on_predict_batch_start: Callable | None = None,
                 on_predict_batch_end: Callable | None = None,
                 on_predict_epoch_start: Callable | None = None,
                 on_predict_epoch_end: Callable | None = None):
        given = {name: value for name, value in locals().items()
                 if name in HOOKS and value is not None}
        self.__class__ = type("LambdaCallback", (LambdaCallback,),
                              {name: _method(function) for name, function in given.items()})
        # two of them in a run must save their (checkpoint hooks') state apart
        self._state_key = f"LambdaCallback[{','.join(given)}]#{next(_made)}"

    @property
    def state_key(self) -> str:
        return self._state_key


__all__ = ["LambdaCallback"]
