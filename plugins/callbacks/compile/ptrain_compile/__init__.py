"""The ``compile`` callback: ``torch.compile`` on the model the strategy built.

Order: ``wrap_model`` is a wrapper that works after ``yield``, on what the strategy returned (a
``DistributedDataParallel`` for ``ddp``, the ``fully_shard``-ed ``StepModule`` for ``fsdp``, the
``StepModule`` itself for ``single-device``): compiling the DDP wrapper is what lets dynamo split
the graph at DDP's bucket boundaries (DDPOptimizer), and FSDP2 is compiled after ``fully_shard``.

The model is compiled in place with :meth:`torch.nn.Module.compile`, not wrapped in the
``OptimizedModule`` that ``torch.compile(model)`` returns. So ``trainer.model`` keeps its type
(strategies test ``isinstance(trainer.model, DistributedDataParallel)`` to skip gradient
synchronisation inside accumulation windows) while every call of it runs compiled, its
``state_dict`` keys get no ``_orig_mod.`` prefix, and ``trainer.module`` (the user's module, which
checkpoints store) is not compiled at all: it stays usable eagerly after ``fit``.

Compilation is lazy: it happens in the first training step, again in the first validation step
(``torch.no_grad`` is a different graph), and whenever a guard fails (a smaller last batch, a
change of the metric store's state from ``self.log``). The plugin reports, once at the end of
``fit`` on global rank 0, the wall time of the training steps during which dynamo compiled and the
mean time of the other steps (see :class:`Compile`).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map_only

from ptrain import ConfigError, PluginError, hookimpl
from ptrain.options import closest, to_bool, to_str

log = logging.getLogger(__name__)

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: the modes in which inductor replays CUDA graphs on a CUDA device
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
FALLBACKS = ("error", "eager")


def backend_problem(name: str) -> str | None:
    """``None`` when ``name`` is a ``torch.compile`` backend registered here, else a sentence
    naming the valid ones (those of ``torch._dynamo.list_backends()`` first, then the debugging
    ones such as ``aot_eager``, which are valid too)."""
    from torch._dynamo import list_backends

    everything = list_backends(exclude_tags=None)
    if name in everything:
        return None
    main = list_backends()
    debugging = sorted(set(everything) - set(main))
    return (f"unknown torch.compile backend {name!r}; valid backends: {', '.join(main)} "
            f"(for debugging: {', '.join(debugging)}).{closest(name, everything)}")


def to_backend(value: Any) -> str | Callable:
    """Converter of the ``backend`` option: a registered backend's name (or, from Python, a
    backend callable, passed to ``torch.compile`` as it is). Raises ``ValueError`` otherwise."""
    if callable(value):
        return value
    name = to_str(value)
    problem = backend_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


def to_optional_bool(value: Any) -> bool | None:
    """``true``/``false``, or ``auto`` (also ``none``) for unset: torch.compile's own choice."""
    if isinstance(value, str) and value.strip().lower() in ("auto", "none"):
        return None
    try:
        return to_bool(value)
    except ValueError:
        raise ValueError(f"expected true, false or auto, got {value!r}") from None


def machine_problem(backend: str | Callable, device: torch.device) -> str | None:
    """Why ``backend`` can't compile for ``device`` on this machine (with the fix), or ``None``.
    Checks what inductor needs before the first step would fail deep inside a compile: a C++
    compiler on CPU, Triton (and a recent enough GPU) on CUDA."""
    if backend == "inductor" and device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler
        except ImportError:  # torch moved it: leave the check to the first compile
            return None
        try:
            get_cpp_compiler()
        except Exception:  # torch raises its own InvalidCxxCompiler
            cxx = os.environ.get("CXX", "g++")
            return (f"inductor on CPU builds its kernels with a C++ compiler, and none was found "
                    f"(tried CXX={cxx}). Install one (e.g. `apt-get install g++`) or set CXX to "
                    f"its path")
    if backend == "inductor" and device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return ("inductor on CUDA generates Triton kernels, and Triton can't run here (not "
                    "installed, or the GPU is older than compute capability 7.0). Install the "
                    "triton that matches torch (`pip install triton`)")
    if backend == "cudagraphs" and device.type != "cuda":
        return f"the cudagraphs backend needs a CUDA device; this run trains on {device.type}"
    return None


class Compile:
    """``-p compile``: compile the strategy's model with ``torch.compile``.

    :param mode: inductor's mode (``default``, ``reduce-overhead``, ``max-autotune``,
        ``max-autotune-no-cudagraphs``); any other than ``default`` needs ``backend="inductor"``.
    :param backend: a name in ``torch._dynamo.list_backends(exclude_tags=None)`` (``inductor``,
        or ``aot_eager``/``eager`` to debug), or from Python a backend callable.
    :param fullgraph: a graph break is an error instead of a fall-back to Python.
    :param dynamic: ``True``/``False`` forces dynamic/static shapes; ``None``: torch's default
        (static first, dynamic after a shape changed).
    :param fallback: what to do when the backend can't run on this machine (no C++ compiler for
        inductor on CPU, no Triton on CUDA): ``error`` stops the run with a
        :class:`ptrain.PluginError` naming the fix; ``eager`` warns and trains uncompiled.

    After ``fit``: ``compiled`` (whether the model was compiled), ``fell_back`` (the reason, when
    it was not), and the timing counters behind :meth:`summary`. Per training step the plugin
    reads ``time.perf_counter()`` once and adds no host-device sync.
    """

    def __init__(self, mode: str = "default", backend: str | Callable = "inductor",
                 fullgraph: bool = False, dynamic: bool | None = None, fallback: str = "error"):
        if mode not in MODES:
            raise ConfigError(f"compile mode {mode!r} is not one of {', '.join(MODES)}."
                              f"{closest(mode, MODES)}")
        if fallback not in FALLBACKS:
            raise ConfigError(f"compile fallback {fallback!r} is not one of "
                              f"{', '.join(FALLBACKS)}.")
        if not callable(backend):
            problem = backend_problem(backend)
            if problem is not None:
                raise ConfigError(f"invalid compile backend: {problem}")
        if mode != "default" and backend != "inductor":
            raise ConfigError(f"compile mode {mode!r} is an inductor setting, and the backend is "
                              f"{_label(backend)!r}, which would ignore it; use --compile-backend "
                              f"inductor or leave --compile-mode at default.")
        self.mode, self.backend, self.fullgraph = mode, backend, fullgraph
        self.dynamic, self.fallback = dynamic, fallback
        self.compiled = False
        self.cuda_graphs = False  # compiled in a mode that replays CUDA graphs, on CUDA
        self.fell_back: str | None = None
        self._reset_counters()

    @staticmethod
    @hookimpl
    def add_options(options) -> None:
        options.add("mode", str, default="default", choices=MODES,
                    help="inductor's mode: reduce-overhead adds CUDA graphs (CUDA only), "
                         "max-autotune benchmarks kernel variants (much longer compile)")
        options.add("backend", to_backend, default="inductor",
                    help="torch.compile backend: inductor (generates kernels), or aot_eager / "
                         "eager to tell a compiler bug from a model bug")
        options.add("fullgraph", to_bool, default=False,
                    help="make a graph break an error instead of a fall-back to Python")
        options.add("dynamic", to_optional_bool, default=None,
                    help="true: compile for dynamic shapes from the start; false: never; auto "
                         "(default): static first, dynamic once a shape changed")
        options.add("fallback", str, default="error", choices=FALLBACKS,
                    help="when the backend can't run here (inductor without a C++ compiler on "
                         "CPU or Triton on CUDA): error stops the run, eager warns and trains "
                         "uncompiled")

    @staticmethod
    @hookimpl
    def check_available() -> str | None:
        from torch._dynamo import is_dynamo_supported

        if is_dynamo_supported():
            return None
        return (f"torch.compile is not supported with this Python/torch build (torch "
                f"{torch.__version__}); use a Python version that torch.compile supports")

    @staticmethod
    @hookimpl
    def tune_candidates(trainer):
        """``ptrain tune`` measures the model compiled in inductor's default mode (the time it
        takes to compile is reported apart), and on a CUDA run its ``reduce-overhead`` (CUDA
        graphs) and ``max-autotune-no-cudagraphs`` (kernels autotuned on the GPU) modes, one
        setting; compiled, it must train as before. Off CUDA those two are listed with the
        reason: their gain is the GPU's, and their extra compile time would be all that
        remained."""
        if "compile" in trainer.plugins:
            return []
        from ptrain.tuning import Candidate

        offered = [Candidate("compile", "compile", callbacks=("compile",))]
        on_cuda = "cuda" in trainer.plugins
        for mode, gain in (("reduce-overhead", "CUDA graphs replay the step's kernels"),
                           ("max-autotune-no-cudagraphs", "it autotunes GPU kernels")):
            offered.append(Candidate(
                f"compile ({mode})", "compile", callbacks=("compile",),
                # a mode is an inductor setting: the candidate names its backend too, so that
                # it means the same whatever backend the run was given
                plugin_options={"compile": {"mode": mode, "backend": "inductor"}},
                unavailable=None if on_cuda else f"offered on CUDA runs only: {gain}"))
        return offered

    # -- compiling -------------------------------------------------------------------------------

    @hookimpl(wrapper=True)
    def wrap_model(self, trainer, model: torch.nn.Module):
        model = yield  # what the strategy built: compile that, not what it was built from
        self.compiled, self.cuda_graphs, self.fell_back = False, False, None
        problem = machine_problem(self.backend, trainer.device)
        if problem is not None:
            if self.fallback == "error":
                raise PluginError(
                    f"-p compile: backend {_label(self.backend)!r} can't run here: {problem}. "
                    f"Or compile with another backend (--compile-backend aot_eager needs no "
                    f"code generation), or train uncompiled with --compile-fallback eager.")
            self.fell_back = problem
            if trainer.is_global_zero:
                warnings.warn(f"compile: {problem}; training uncompiled (--compile-fallback "
                              f"eager).", stacklevel=1)
            return model
        options: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph,
                                   "dynamic": self.dynamic}
        if self.mode != "default":
            options["mode"] = self.mode
        model.compile(**options)
        self.compiled = True
        self.cuda_graphs = self.mode in CUDA_GRAPH_MODES and trainer.device.type == "cuda"
        return model

    @hookimpl(wrapper=True)
    def model_step(self, trainer):
        """With CUDA graphs, a step's outputs live in the graphs' memory, which the next replay
        overwrites: the loss (and whatever else the step returns) and the values the step logged
        are copied out, so that a callback may read them after later steps (torch raises
        otherwise: "accessing tensor output of CUDAGraphs that has been overwritten"). Copies of
        a few scalars per step, on the device: no sync. Each step is marked as a new iteration
        of the graphs first."""
        if not self.cuda_graphs:
            return (yield)
        torch.compiler.cudagraph_mark_step_begin()
        output = yield
        trainer.metrics.own_values()
        return tree_map_only(torch.Tensor, torch.clone, output)

    # -- timing ----------------------------------------------------------------------------------
    # Dynamo runs the start/end callbacks around each compilation (a new graph, a lazily compiled
    # backward), on the host. A training step is "compiling" when a compilation ended in it.

    def _reset_counters(self) -> None:
        self.compile_seconds = 0.0      # inside dynamo's compilations
        self.graphs = 0                 # graphs dynamo compiled (backward passes not counted)
        self.compile_steps = 0          # training steps during which something compiled
        self.compile_step_seconds = 0.0
        self.steady_steps = 0           # the others, without a validation run in them
        self.steady_step_seconds = 0.0
        self._compilations = 0
        self._started = 0.0
        self._mark = 0.0
        self._seen = 0
        self._validated = False
        self._training_started = False
        self.before_training_seconds = 0.0  # compiling before the first epoch: the sanity check

    def _on_compile_start(self, args) -> None:
        self._started = time.perf_counter()

    def _on_compile_end(self, args) -> None:
        self.compile_seconds += time.perf_counter() - self._started
        self._compilations += 1
        if args.callback_trigger.name == "DYNAMO":
            self.graphs += 1

    @hookimpl
    def setup(self, trainer, stage: str) -> None:
        self._reset_counters()
        if stage == "fit" and self.compiled:
            handler = torch._dynamo.callback_handler
            handler.register_start_callback(self._on_compile_start)
            handler.register_end_callback(self._on_compile_end)

    @hookimpl
    def on_epoch_start(self) -> None:
        if not self._training_started:  # what compiled so far did so outside any training step
            self._training_started = True
            self.before_training_seconds, self.compile_seconds = self.compile_seconds, 0.0
        # an epoch's first step is timed from here: the time between epochs is not a step's
        self._mark = time.perf_counter()
        self._seen = self._compilations
        self._validated = False

    @hookimpl
    def on_validation_end(self, trainer) -> None:
        if trainer.stage == "train":  # a validation inside fit runs within a training step
            self._validated = True

    @hookimpl
    def on_train_batch_end(self, trainer, batch, batch_idx, loss) -> None:
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        if self._compilations != self._seen:
            self._seen = self._compilations
            self.compile_steps += 1
            self.compile_step_seconds += seconds
        elif self._validated:
            pass  # neither compile time nor a steady step
        else:
            self.steady_steps += 1
            self.steady_step_seconds += seconds
        self._validated = False

    def summary(self) -> str | None:
        """The report line (``None`` before a compiled ``fit``)::

            compile (inductor): 12.3 s in 2 step(s) that compiled (5 graphs, 11.9 s compiling);
            then 4.10 ms per step (118 steps)

        Compilation before the first epoch (the sanity check's validation graphs) is counted
        apart, in ``before_training_seconds``, and named when there was any. Step times are wall times between consecutive ``on_train_batch_end`` calls (an epoch's
        first step from ``on_epoch_start``), data loading included. Steps that ran a validation
        and compiled nothing are left out of both figures.
        """
        if not self.compiled:
            return None
        line = (f"compile ({_label(self.backend)}): {self.compile_step_seconds:.1f} s in "
                f"{self.compile_steps} step(s) that compiled ({self.graphs} graphs, "
                f"{self.compile_seconds:.1f} s compiling)")
        if self.before_training_seconds:
            line += (f" and {self.before_training_seconds:.1f} s compiling the sanity check's "
                     f"validation before training")
        if self.steady_steps:
            per_step = self.steady_step_seconds / self.steady_steps
            return line + f"; then {per_step * 1e3:.2f} ms per step ({self.steady_steps} steps)"
        return line + "; no step without compilation to compare with"

    @hookimpl
    def teardown(self, trainer, stage: str) -> None:
        if stage != "fit" or not self.compiled:
            return
        handler = torch._dynamo.callback_handler
        for callbacks, callback in ((handler.start_callbacks, self._on_compile_start),
                                    (handler.end_callbacks, self._on_compile_end)):
            if callback in callbacks:  # torch._dynamo.reset() may have cleared them
                callbacks.remove(callback)
        if trainer.is_global_zero and trainer.exception is None:
            line = self.summary()
            log.info(line)
            print(line, flush=True)


def _label(backend: str | Callable) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
