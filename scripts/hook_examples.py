# ruff: noqa: F811  (each part redefines names: the parts are separate examples)
# One example implementation per hook, for docs/hooks.md. scripts/gen_hook_docs.py splits this file
# at the "# == HOOK" lines, shows each part as it is, and checks it: every part is run on its own
# and its classes registered against the hook specification (a misspelt hook or an argument the
# hook does not have fails), and it must implement the hook it illustrates.
# == add_options
from ptrain import hookimpl


class Warmup:
    """As entry point ``warmup``: the flag ``--warmup-steps``, the key ``steps`` of
    ``[plugins.warmup]``, and ``Warmup(steps=...)`` from Python."""

    def __init__(self, steps: int = 100):
        self.steps = steps

    @staticmethod  # called on the class, before any instance exists
    @hookimpl
    def add_options(options):
        options.add("steps", int, default=100, help="warm-up length, in optimizer steps")
# == check_available
import torch

from ptrain import hookimpl


class XPUAccelerator:
    @staticmethod
    @hookimpl
    def check_available():
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            return "torch sees no Intel XPU: install torch's XPU build and the GPU driver"
        return None
# == tune_candidates
from ptrain import hookimpl
from ptrain.tuning import Candidate


class FP8Precision:
    """As entry point ``fp8``: ``ptrain tune`` measures it against the user's precision."""

    @staticmethod  # called on the class, whether or not the run selects the plugin
    @hookimpl
    def tune_candidates(trainer):
        if trainer.options["precision"] == "fp8":
            return []  # the user's own setting already
        return [Candidate("precision fp8", "precision", trainer={"precision": "fp8"},
                          numerics="changed")]  # judged on its loss, not held to equal it
# == launch
from ptrain import ConfigError, hookimpl


class OneProcess:
    @hookimpl
    def launch(self, trainer):
        if trainer.devices not in (1, "auto"):
            raise ConfigError(f"one process only; --devices {trainer.devices} asks for more")
        return None  # run the stage here; a multi-process strategy starts workers instead
# == setup_device
import torch

from ptrain import hookimpl


class XPUAccelerator:
    @hookimpl
    def setup_device(self, trainer):
        device = torch.device("xpu", trainer.local_rank)  # a strategy set local_rank before
        torch.xpu.set_device(device)
        return device
# == precision_policy
import torch

from ptrain import PrecisionPolicy, hookimpl


class BF16Mixed:
    @hookimpl
    def precision_policy(self):
        return PrecisionPolicy(param_dtype=torch.float32, compute_dtype=torch.bfloat16,
                               reduce_dtype=torch.float32)
# == module_init_context
import contextlib

import torch

from ptrain import hookimpl


class BF16Init:
    """Layers made in configure_model (or Trainer.init_module) get bfloat16 parameters from the
    start, instead of float32 ones cast later."""

    @hookimpl
    def module_init_context(self, empty_init):
        @contextlib.contextmanager
        def bf16_default():
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                yield
            finally:
                torch.set_default_dtype(previous)

        return bf16_default()
# == modify_parallel_plan
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel

from ptrain import hookimpl


class GatheredLogits:
    """Whatever the module's plan does with its output layer, the logits come back whole on
    every process (a loss that can't take sharded logits)."""

    @hookimpl
    def modify_parallel_plan(self, plan):
        style = plan.get("output")
        if isinstance(style, ColwiseParallel):
            plan["output"] = ColwiseParallel(input_layouts=style.input_layouts[0],
                                             output_layouts=Replicate())
# == wrap_model
import torch

from ptrain import hookimpl


class Compile:
    @hookimpl(wrapper=True)
    def wrap_model(self):
        model = yield  # what the strategy returned: on the device, maybe wrapped (DDP)
        return torch.compile(model)
# == wrap_optimizer
import inspect

from ptrain import hookimpl


class ShardedOptimizerState:
    @hookimpl
    def wrap_optimizer(self, trainer, optimizer):
        if trainer.world_size == 1:
            return None  # nothing to shard: the next implementation decides (the default keeps it)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        accepted = inspect.signature(type(optimizer).__init__).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        return ZeroRedundancyOptimizer([dict(g) for g in optimizer.param_groups],
                                       optimizer_class=type(optimizer), **defaults)
# == prepare_dataloader
from ptrain import hookimpl
from ptrain.data import rebuild_dataloader


class PinMemory:
    @hookimpl(wrapper=True)
    def prepare_dataloader(self, dataloader, stage):
        loader = yield  # what the other implementations made of it (a sharded sampler, ...)
        return loader if loader.pin_memory else rebuild_dataloader(loader, pin_memory=True)
# == unused_step_hooks
import time

from ptrain import hookimpl


class SaveEvery:
    """Saves every ``minutes`` (checked at each batch's end); ``minutes=None`` turns it off."""

    def __init__(self, minutes: float | None = 30.0):
        self.minutes, self.last = minutes, time.monotonic()

    @hookimpl
    def unused_step_hooks(self):
        return ["on_train_batch_end"] if self.minutes is None else None

    @hookimpl
    def on_train_batch_end(self, trainer):
        if time.monotonic() - self.last >= 60 * self.minutes:
            trainer.save_checkpoint(trainer.log_dir / f"step-{trainer.global_step}.ckpt")
            self.last = time.monotonic()
# == on_stage_start
from ptrain import hookimpl


class FreezeEmbeddings:
    """Freeze the embeddings before the optimizers are built, so that they leave them out."""

    @hookimpl
    def on_stage_start(self, trainer, stage):
        if stage == "fit" and hasattr(trainer.module, "embedding"):
            trainer.module.embedding.requires_grad_(False)
# == setup
import time

from ptrain import hookimpl


class WallClock:
    @hookimpl
    def setup(self, trainer, stage):
        self.started = time.perf_counter()
        if trainer.is_global_zero:
            print(f"{stage}: {trainer.world_size} process(es) on {trainer.device}")
# == report_error
import os

from ptrain import WorkerError, hookimpl


class PeerLost:
    """A rank whose collective broke because a peer died says which peer, not only "connection
    reset" (a sketch: ptrain's strategies report the first failing rank's own error)."""

    @hookimpl
    def report_error(self, trainer, exception):
        if trainer.world_size > 1 and "Connection closed by peer" in str(exception):
            return WorkerError(f"rank {trainer.global_rank} (pid {os.getpid()}) lost a peer "
                               f"in a collective: {exception}")
        return None  # raise the error as it is
# == teardown
import time

from ptrain import hookimpl


class WallClock:
    @hookimpl
    def setup(self):
        self.started = time.perf_counter()

    @hookimpl
    def teardown(self, trainer, stage):
        if trainer.is_global_zero:
            outcome = "failed" if trainer.exception is not None else "done"
            print(f"{stage} {outcome} after {time.perf_counter() - self.started:.1f} s")
# == on_loop_start
import time

from ptrain import hookimpl


class LoopClock:
    def __init__(self):
        self.started = {}

    @hookimpl
    def on_loop_start(self, loop):
        self.started[loop] = time.perf_counter()
# == on_loop_end
import time

from ptrain import hookimpl


class LoopClock:
    def __init__(self):
        self.started = {}

    @hookimpl
    def on_loop_start(self, loop):
        self.started[loop] = time.perf_counter()

    @hookimpl
    def on_loop_end(self, trainer, loop):
        seconds = time.perf_counter() - self.started.pop(loop)
        if trainer.is_global_zero and loop in ("fit", "test"):
            print(f"{loop} took {seconds:.1f} s")
# == evaluation_mode
from ptrain import hookimpl


class KeepBatchNormTraining:
    """Evaluate with dropout off but batch-norm layers still normalising per batch."""

    @hookimpl
    def evaluation_mode(self, trainer):
        trainer.model.eval()
        for layer in trainer.model.modules():
            if "BatchNorm" in type(layer).__name__:
                layer.train()
        return True
# == transfer_batch
from ptrain import hookimpl
from ptrain.data import move_to_device


class XPUAccelerator:
    @hookimpl
    def transfer_batch(self, trainer, batch):
        # from pinned memory the copy is asynchronous: the step does not wait for it
        return move_to_device(batch, trainer.device, non_blocking=True)
# == on_batch_start
from ptrain import hookimpl


class CountSamples:
    def __init__(self):
        self.samples = 0

    @hookimpl
    def on_batch_start(self, stage, batch):
        if stage == "train":
            self.samples += len(batch[0])  # a shape: no wait for the device
# == model_step
import torch

from ptrain import hookimpl


class BF16Autocast:
    @hookimpl(wrapper=True)
    def model_step(self, trainer):
        with torch.autocast(trainer.device.type, dtype=torch.bfloat16):
            return (yield)  # the forward pass and the loss run inside
# == on_before_backward
from ptrain import hookimpl


class LossSum:
    def __init__(self):
        self.total = None

    @hookimpl
    def on_before_backward(self, loss):
        loss = loss.detach()  # stays on the device: no host sync per step
        self.total = loss if self.total is None else self.total + loss
# == backward
import torch

from ptrain import hookimpl


class LossScaling:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")

    @hookimpl
    def backward(self, loss):
        self.scaler.scale(loss).backward()
        return True  # done: the default loss.backward() does not run
# == on_after_backward
import torch

from ptrain import hookimpl


class GradientNorm:
    @hookimpl
    def on_after_backward(self, trainer):
        grads = [p.grad for p in trainer.module.parameters() if p.grad is not None]
        # a tensor, logged without a host sync; published every log_every_n_steps
        trainer.module.log("grad_norm", torch.nn.utils.get_total_norm(grads))
# == on_before_optimizer_step
import torch

from ptrain import hookimpl


class GradNormWatch:
    @hookimpl
    def on_before_optimizer_step(self, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if grads:  # kept as a tensor: reading it here would make every step wait for the device
            self.last_norm = torch.nn.utils.get_total_norm(grads)
# == clip_gradients
import torch

from ptrain import hookimpl


class ClipEachParameter:
    """Clip each parameter's gradient norm on its own instead of the global norm."""

    @hookimpl
    def clip_gradients(self, trainer, optimizer):
        if trainer.gradient_clip_algorithm != "norm":
            return None  # leave value clipping to the next implementation (the default)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    torch.nn.utils.clip_grad_norm_([p], trainer.gradient_clip_val)
        return True
# == optimizer_step
import torch

from ptrain import hookimpl


class LossScaling:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cuda")

    @hookimpl
    def optimizer_step(self, optimizer):
        self.scaler.step(optimizer)  # skips the step if the gradients overflowed
        self.scaler.update()
        return True
# == on_before_zero_grad
import torch

from ptrain import hookimpl


class WeightAverage:
    def __init__(self, decay: float = 0.999):
        self.decay, self.average = decay, None

    @hookimpl
    def on_before_zero_grad(self, trainer):
        weights = [p.detach() for p in trainer.module.parameters()]
        if self.average is None:
            self.average = [w.clone() for w in weights]
        else:
            torch._foreach_lerp_(self.average, weights, 1 - self.decay)
# == on_train_step_end
import torch
import torch.nn.functional as F

from ptrain import hookimpl


class OnlineProbe:
    """A linear probe trained on the frozen features after each step, as self-supervised runs
    track accuracy; the validation the step triggers sees the probe it left."""

    def __init__(self, features: int, classes: int):
        self.probe = torch.nn.Linear(features, classes)
        self.optimizer = torch.optim.Adam(self.probe.parameters(), lr=1e-3)

    @hookimpl
    def on_train_step_end(self, trainer, batch):
        x, y = batch
        with torch.no_grad():
            features = trainer.module(x)
        loss = F.cross_entropy(self.probe.to(features.device)(features), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        trainer.module.log("probe_loss", loss.detach())
# == on_train_batch_end
from ptrain import hookimpl


class StopAfter:
    def __init__(self, steps: int = 1000):
        self.steps = steps

    @hookimpl
    def on_train_batch_end(self, trainer):
        if trainer.global_step >= self.steps:  # a Python int: no wait for the device
            trainer.should_stop = True
# == on_evaluation_batch_end
from pathlib import Path

import torch

from ptrain import hookimpl


class WritePredictions:
    @hookimpl
    def on_evaluation_batch_end(self, trainer, stage, outputs, batch_idx):
        if stage != "predict":
            return
        folder = Path(trainer.log_dir) / "predictions"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(outputs, folder / f"rank{trainer.global_rank}-batch{batch_idx}.pt")
# == on_epoch_start
from ptrain import hookimpl


class ReshuffleEachEpoch:
    @hookimpl
    def on_epoch_start(self, trainer):
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # a DistributedSampler shuffles by epoch
            sampler.set_epoch(trainer.current_epoch)
# == on_epoch_metrics
import time

from ptrain import hookimpl


class EpochSeconds:
    @hookimpl
    def on_epoch_start(self):
        self.start = time.perf_counter()

    @hookimpl
    def on_epoch_metrics(self, trainer, stage):
        if stage == "train":  # published with the epoch's other metrics
            trainer.module.log("epoch_seconds", time.perf_counter() - self.start,
                               on_step=False, on_epoch=True)
# == on_epoch_end
from ptrain import hookimpl


class PrintMetrics:
    @hookimpl
    def on_epoch_end(self, trainer):
        if trainer.is_global_zero:  # numbers once per epoch: waiting for the device is fine here
            metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
            print(f"epoch {trainer.current_epoch}: {metrics}")
# == on_validation_end
from ptrain import hookimpl


class StopAtAccuracy:
    def __init__(self, target: float = 0.99):
        self.target = target

    @hookimpl
    def on_validation_end(self, trainer):
        accuracy = trainer.callback_metrics.get("val_acc")  # reduced over every process
        if accuracy is not None and float(accuracy) >= self.target:
            trainer.should_stop = True
# == reduce_metrics
import torch
import torch.distributed as dist

from ptrain import hookimpl

OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


class AllReduceMetrics:
    @hookimpl
    def reduce_metrics(self, trainer, metrics, op):
        names = list(metrics)
        flat = torch.cat([metrics[n].float().reshape(-1) for n in names])
        dist.all_reduce(flat, op=OPS[op])  # one collective for all of them
        if op == "mean":
            flat = flat / trainer.world_size
        parts = flat.split([metrics[n].numel() for n in names])
        return {n: part.reshape(metrics[n].shape) for n, part in zip(names, parts)}
# == all_gather_object
import torch.distributed as dist

from ptrain import hookimpl


class GatherObjects:
    @hookimpl
    def all_gather_object(self, trainer, obj):
        gathered = [None] * trainer.world_size
        dist.all_gather_object(gathered, obj)
        return gathered
# == log_metrics
import csv
from pathlib import Path

from ptrain import hookimpl


class CSVLogger:
    @hookimpl
    def log_metrics(self, trainer, metrics, step):
        if not trainer.is_global_zero:
            return
        with open(Path(trainer.log_dir) / "metrics.csv", "a", newline="") as f:
            csv.writer(f).writerows([step, name, value] for name, value in metrics.items())
# == log_hyperparams
import json
from pathlib import Path

from ptrain import hookimpl


class JSONHyperparams:
    @hookimpl
    def log_hyperparams(self, trainer, hyperparameters):
        if not trainer.is_global_zero:
            return
        record = {"hparams": hyperparameters, "config": trainer.config}
        path = Path(trainer.log_dir) / "run.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, default=str))
# == state_dict
from ptrain import hookimpl


class BatchCounter:
    def __init__(self):
        self.batches = 0

    @hookimpl
    def on_train_batch_end(self):
        self.batches += 1

    @hookimpl
    def state_dict(self):
        return {"batches": self.batches}  # stored under this plugin's name
# == load_state_dict
from ptrain import hookimpl


class BatchCounter:
    def __init__(self):
        self.batches = 0

    @hookimpl
    def load_state_dict(self, state):
        self.batches = state["batches"]  # what state_dict returned when the checkpoint was saved
# == applied_optimizer_settings
from ptrain import hookimpl


class HalveTheLearningRate:
    """Trains with half the learning rates configure_optimizers gives."""

    @hookimpl
    def setup(self, trainer, stage):
        if stage == "fit" and trainer.ckpt_path is None:  # a resumed optimizer has them
            for group in trainer.optimizers[0].param_groups:
                group["lr"] /= 2

    @hookimpl
    def applied_optimizer_settings(self, settings):
        for group in settings[0]:  # what this plugin applies: an unchanged resume is silent
            group["lr"] /= 2
# == save_checkpoint
import torch.distributed as dist

from ptrain import hookimpl


class BarrierAfterSave:
    @hookimpl(wrapper=True)
    def save_checkpoint(self, trainer):
        written = yield  # whichever implementation wrote the file
        if trainer.world_size > 1:
            dist.barrier()  # no process reads the checkpoint before it is complete
        return written
# == save_checkpoint_in_background
import torch

from ptrain import hookimpl


class HalfPrecisionFiles:
    """Checkpoints whose floating-point weights are stored in bfloat16, written synchronously
    (``save_checkpoint``) or in the background (``async_save``)."""

    @staticmethod
    def halved(checkpoint):
        model = {k: v.bfloat16() if v.is_floating_point() else v
                 for k, v in checkpoint["model"].items()}
        return {**checkpoint, "model": model}

    @hookimpl
    def save_checkpoint(self, trainer, checkpoint, path):
        if trainer.is_global_zero:
            torch.save(self.halved(checkpoint), path)
        return True

    @hookimpl
    def save_checkpoint_in_background(self, trainer, checkpoint, path):
        if not trainer.is_global_zero:
            return []
        copy = trainer.copy_for_background(self.halved(checkpoint))  # the stall, on this thread
        return [lambda: torch.save(copy, path)]  # on the writer's thread
# == resolve_ckpt_path
from pathlib import Path

from ptrain import CheckpointError, hookimpl


class PretrainedAlias:
    """``--ckpt-path pretrained`` loads the file a team keeps next to its runs."""

    @hookimpl
    def resolve_ckpt_path(self, trainer, ckpt_path):
        if ckpt_path != "pretrained":
            return None  # "last", "best" and paths: for the others
        path = Path(trainer.default_root_dir) / "pretrained.ckpt"
        if not path.is_file():
            raise CheckpointError(f"ckpt_path='pretrained': {str(path)!r} does not exist; copy "
                                  f"the pretrained checkpoint there or give its path.")
        return str(path)
# == load_checkpoint
import torch

from ptrain import hookimpl


class LoadOnCPU:
    @hookimpl
    def load_checkpoint(self, path):
        return torch.load(path, map_location="cpu", weights_only=True)
# == verify_checkpoint
import hashlib
from pathlib import Path

from ptrain import CheckpointError, hookimpl


class Sha256Sidecar:
    """Checkpoints copied between clusters carry a ``.sha256`` file; ``last-intact`` checks it."""

    @hookimpl(tryfirst=True)
    def verify_checkpoint(self, path):
        sidecar = Path(f"{path}.sha256")
        if not sidecar.is_file():
            return None  # not copied: the default check reads it
        if hashlib.sha256(Path(path).read_bytes()).hexdigest() != sidecar.read_text().split()[0]:
            raise CheckpointError(f"{path}: its SHA-256 does not match {sidecar}")
        return True
