"""The harness's probe: imported by every Python process of a catalogued run (this folder is put
first on ``PYTHONPATH``), it watches and never changes what a program computes, beyond giving
it locally made stand-ins for what it would download.

Active only when ``LP_PROBE_DIR`` is set. It then

- seeds Python's, NumPy's and torch's generators with 0 at start-up, so a program that never
  seeds starts from the same weights under both frameworks (a program's own seeding still wins);
- wraps ``fit``/``validate``/``test``/``predict`` of Lightning's ``Trainer`` and of ptrain's
  (whichever the program imports) to record, after each call, the trainer's
  ``callback_metrics``, what the call returned (test and validate results), ``global_step`` and
  ``current_epoch``; a call that raises is recorded with its error;
- answers every URL the program opens with urllib by HTTP 404 ("offline"): the programs that try
  to fetch pretrained files catch that and train instead; without it they stop on the DNS error;
- accepts torchvision's CIFAR files that are present, where torchvision compares MD5 sums with
  the real data set's (the harness made the files, see ``data.py``);
- gives torchvision's pretrained weights, which it would download, as the weights of the same
  architecture built under a seeded generator (the same under both frameworks: made locally,
  like the data sets);
- with ``LP_STANDIN_ROOT`` set (a program run with the harness's stand-ins), imports
  torchmetrics at start-up, before the program can import the torchvision stand-in;
- writes ``probe-<pid>.json`` into ``LP_PROBE_DIR`` when the process exits.

With ``LP_LIMIT_BATCHES=T,E`` it gives every ``Trainer(...)`` the program makes
``limit_train_batches=T`` and ``limit_val/test/predict_batches=E`` where the program set none
(the same under both frameworks): the harness's way to run a program as written in minutes on
a shared two-core machine; ``--full`` turns it off. With ``LP_MAX_EPOCHS=N`` (the catalogue's
``max_epochs``, for a notebook that trains for hundreds of epochs) a ``max_epochs`` above ``N``
becomes ``N``.

With ``LP_SHIMS=1`` (the harness's ``--shims``, a diagnostic to find what breaks *after* the
first failures found) it also supplies what ptrain lacked when measured: the module
``ptrain.lightning.utilities.imports`` with Lightning's ``_<PACKAGE>_AVAILABLE`` flags, the
submodules ``callbacks``/``loggers``/``utilities`` as attributes of ``ptrain.lightning`` once it is
imported, and ``lightning_utilities``' ``rank_zero_only.rank`` (Lightning sets it on import).
A run made so is marked in the results.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

_DIR = os.environ.get("LP_PROBE_DIR")
_RECORDS: list[dict] = []
_START = time.time()


def _number(value):
    try:
        if hasattr(value, "detach"):
            value = value.detach().float()
            return float(value.item()) if value.numel() == 1 else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    except Exception:  # noqa: BLE001 - a value the probe can't read is left out
        return None
    return None


def _metrics(mapping) -> dict:
    out = {}
    try:
        items = dict(mapping).items()
    except Exception:  # noqa: BLE001
        return out
    for key, value in items:
        number = _number(value)
        if number is not None:
            out[str(key)] = number
    return out


def _record(trainer, stage: str, result, error: BaseException | None) -> None:
    entry = {"stage": stage, "trainer": type(trainer).__module__ + "." + type(trainer).__name__,
             "time": time.time() - _START}
    for name in ("global_step", "current_epoch"):
        try:
            entry[name] = int(getattr(trainer, name))
        except Exception:  # noqa: BLE001
            pass
    try:
        entry["callback_metrics"] = _metrics(trainer.callback_metrics)
    except Exception as exc:  # noqa: BLE001
        entry["callback_metrics_error"] = repr(exc)
    if isinstance(result, list) and all(isinstance(r, dict) for r in result):
        entry["result"] = [_metrics(r) for r in result]
    if error is not None:
        entry["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    _RECORDS.append(entry)


def _wrap_trainer(cls) -> None:
    for stage in ("fit", "validate", "test", "predict"):
        original = cls.__dict__.get(stage)
        if original is None or getattr(original, "_lp_probe", False):
            continue

        def wrapper(self, *args, _original=original, _stage=stage, **kwargs):
            depth = self.__dict__.get("_lp_depth", 0)
            self.__dict__["_lp_depth"] = depth + 1
            result, error = None, None
            try:
                result = _original(self, *args, **kwargs)
                return result
            except BaseException as exc:
                error = exc
                raise
            finally:
                self.__dict__["_lp_depth"] = depth
                if depth == 0:
                    _record(self, _stage, result, error)

        wrapper._lp_probe = True
        wrapper.__name__ = stage
        wrapper.__qualname__ = f"{cls.__qualname__}.{stage}"
        wrapper.__doc__ = original.__doc__
        wrapper.__wrapped__ = original
        setattr(cls, stage, wrapper)


def _limit_batches(cls) -> None:
    spec = os.environ.get("LP_LIMIT_BATCHES")
    cap = os.environ.get("LP_MAX_EPOCHS")
    original = cls.__init__
    if not spec or getattr(original, "_lp_probe", False):
        return
    train, evaluation = (int(x) for x in spec.split(","))

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("limit_train_batches", train)
        for stage in ("val", "test", "predict"):
            kwargs.setdefault(f"limit_{stage}_batches", evaluation)
        if cap and (kwargs.get("max_epochs") or 0) > int(cap):
            kwargs["max_epochs"] = int(cap)
        original(self, *args, **kwargs)

    __init__._lp_probe = True
    __init__.__wrapped__ = original
    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__


def _watch_trainer(cls, limit: bool) -> None:
    _wrap_trainer(cls)
    if limit:
        _limit_batches(cls)


def _shim_package(module) -> None:
    if os.environ.get("LP_SHIMS") != "1":
        return
    import importlib

    for name in ("callbacks", "loggers", "utilities"):
        try:
            importlib.import_module(f"{module.__name__}.{name}")
        except ImportError:
            pass
    try:
        from lightning_utilities.core.rank_zero import rank_zero_only

        if not hasattr(rank_zero_only, "rank"):
            rank_zero_only.rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))
    except ImportError:
        pass


def _accept_present_cifar(module) -> None:
    """torchvision's CIFAR classes check each file (and the metadata file) against the real
    data set's MD5 sums through the module's ``check_integrity``: here, present is enough."""
    module.check_integrity = lambda fpath, md5=None: os.path.isfile(fpath)


def _made_pretrained_weights(module) -> None:
    """torchvision's pretrained weights (``resnet18(pretrained=True)``) come from the network:
    here, where the hub cache lacks the file, they are the weights of the same architecture
    built under torch's generator seeded with 0 (the program's own generators untouched), so
    the program runs, from the same weights under both frameworks."""
    fetch = module.load_state_dict_from_url

    def load_state_dict_from_url(url, *args, **kwargs):
        import torch
        import torchvision

        name = os.path.basename(url)
        cached = os.path.join(torch.hub.get_dir(), "checkpoints", name)
        build = getattr(torchvision.models, name.split("-")[0], None)
        if os.path.exists(cached) or build is None:
            return fetch(url, *args, **kwargs)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return build().state_dict()

    module.load_state_dict_from_url = load_state_dict_from_url


_AFTER_IMPORT = {
    "lightning.pytorch.trainer.trainer": lambda m: _watch_trainer(m.Trainer, True),
    "pytorch_lightning.trainer.trainer": lambda m: _watch_trainer(m.Trainer, True),
    "ptrain.trainer": lambda m: _watch_trainer(m.Trainer, False),
    "ptrain.lightning.trainer": lambda m: _watch_trainer(m.Trainer, True),
    "ptrain.lightning": _shim_package,
    "torchvision.datasets.cifar": _accept_present_cifar,
    "torchvision.models._api": _made_pretrained_weights,
}


class _Shims(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Supplies modules ptrain lacks, for the ``LP_SHIMS`` diagnostic only."""

    NAMES = ("ptrain.lightning.utilities.imports",)

    def find_spec(self, name, path=None, target=None):
        if name not in self.NAMES:
            return None
        if importlib.machinery.PathFinder.find_spec(name, path) is not None:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import importlib.util

        for package in ("torchvision", "torchmetrics", "omegaconf", "hydra", "rich", "wandb",
                        "mlflow", "tensorboard", "tensorboardX", "jsonargparse"):
            flag = f"_{package.upper()}_AVAILABLE"
            setattr(module, flag, importlib.util.find_spec(package) is not None)


class _Watch(importlib.abc.MetaPathFinder):
    """Runs the matching ``_AFTER_IMPORT`` entry right after a watched module executes."""

    def find_spec(self, name, path=None, target=None):
        if name not in _AFTER_IMPORT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module, _execute=execute, _name=name):
            _execute(module)
            _AFTER_IMPORT[_name](module)

        loader.exec_module = exec_module
        return spec


def _offline() -> None:
    import urllib.error
    import urllib.request

    class Offline(urllib.request.BaseHandler):
        handler_order = 0

        def default_open(self, req):
            raise urllib.error.HTTPError(req.full_url, 404, "offline (lightning_programs probe)",
                                         None, None)

    urllib.request.install_opener(urllib.request.build_opener(Offline()))


def _write() -> None:
    payload = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv,
               "rank": os.environ.get("RANK", os.environ.get("LOCAL_RANK")),
               "elapsed": time.time() - _START, "records": _RECORDS}
    try:
        with open(os.path.join(_DIR, f"probe-{os.getpid()}.json"), "w") as f:
            json.dump(payload, f)
    except OSError:
        pass


if _DIR:
    sys.meta_path.insert(0, _Watch())
    if os.environ.get("LP_SHIMS") == "1":
        sys.meta_path.append(_Shims())
    _offline()
    atexit.register(_write)
    import random

    random.seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(0)
    except ImportError:
        pass
    if os.environ.get("LP_STANDIN_ROOT"):
        # torchmetrics decides on import whether torchvision is there, and then imports parts
        # of it the stand-in lacks; imported first, it finds none (the stand-in refuses
        # libraries), whatever order the program imports them in (Lightning imports it first
        # anyway; ptrain.lightning does not)
        try:
            importlib.import_module("torchmetrics")
        except ImportError:
            pass
