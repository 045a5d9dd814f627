"""Issue 14's speed-ups on a GPU, side by side in one run: a hand-written loop, ptrain and
Lightning on the same model, data, initial weights and optimizer, in every precision, with and
without ``torch.compile``.

    python benchmarks/gpu.py --out OUT                     # on a CUDA machine: the whole matrix
    python benchmarks/gpu.py --out OUT --sections matrix --workloads decoder
    python benchmarks/gpu.py --reduced --out OUT           # CPU: tiny models, checks the plumbing

What runs (each arm in a fresh process, so memory, compile caches and TF32 settings are its own):

- **workloads**: ``decoder``, a GPT-style decoder (pre-norm blocks, causal
  ``scaled_dot_product_attention``, GELU MLP, tied embedding; 12 layers, d_model 768, 12 heads,
  sequence 1024) trained as a byte-level language model on the Python standard library's own
  source text (real text that ships with every Python; vocabulary 256); ``conv``, a ResNet-style
  net (4 stages of 2 residual blocks, 64-512 channels) on 128x128 images drawn by the code
  (classes are oriented stripe patterns under noise), for cuDNN benchmark and channels-last;
  ``mlp``, scikit-learn's handwritten digits through an MLP 64-256-256-10 at batch 64: a step
  of a few dozen small kernels, bound by the host's launching, where a trainer's own per-step
  work shows on a GPU (give it ``--steps 400`` or more: its steps are fractions of a ms).
- **configurations**: ``32-true`` (TF32 off: ``highest`` matmul precision and no TF32 in cuDNN's
  convolutions), ``32-tf32`` (``high``, and cuDNN's TF32),
  ``16-mixed`` (autocast + GradScaler), ``bf16-mixed``, ``bf16-true``; each eager and compiled
  (inductor, default mode); ``conv`` also eager 32-true with cuDNN benchmark and eager
  bf16-mixed in channels-last (ptrain: ``-p channels-last``; the others convert the model and
  each image batch as a user writes it). The optimizer is
  AdamW with ``fused=True`` on CUDA (``foreach`` on the CPU) in every runner.
- **runners**: ``hand`` (the loop a careful user writes: pinned memory, ``non_blocking`` copies,
  ``zero_grad(set_to_none=True)``, no host sync per step), ``ptrain`` (``ptrain.Trainer`` with the
  matching ``--precision``, ``-p compile``, ``--cuda-float32-matmul-precision``,
  ``--cuda-cudnn-benchmark``; default callbacks off but dataloading) and ``lightning``
  (``lightning.Trainer``, ``torch.compile`` of the module, loggers and checkpoints off).
- **figures**: samples/s (tokens/s for the decoder) between the end of step ``--warmup`` and the
  last step (the device synchronised at both ends only); model FLOPs utilisation: the FLOPs of one
  training step (``torch.utils.flop_counter.FlopCounterMode`` on the eager model: forward and
  backward) times steps/s over ``--peak-tflops`` (default 989: the H100 SXM's dense bf16 peak);
  peak memory (``torch.cuda.max_memory_allocated``; on the CPU the process's peak RSS); the final
  loss (mean of the last 5 steps) and its difference to the hand loop's.
- ``--sections ac``: with and without ``-p activation-checkpointing`` on the decoder in
  bf16-mixed, the largest batch that fits, found by ptrain's ``batch-size-finder`` (a real CUDA
  out-of-memory ends its doubling).
- ``--sections fp8``: ``decoder-wide`` (the decoder at d_model 2048, 16 heads, 8 layers,
  sequence 1024, batch 16: matmuls large enough for float8 to pay) in bf16-mixed and
  ``fp8-mixed`` (torchao's float8 matmuls for the Linear layers; ptrain's ``ptrain-fp8-precision``,
  the hand loop converting the same layers with torchao as a user writes it), eager and
  compiled, hand and ptrain (Lightning has no torchao float8 precision: its bf16-mixed arms
  run as the reference). The table gives each fp8 arm's speed against bf16-mixed of the same
  runner and compile, its MFU against the dense bf16 peak and the dense float8 peak
  (``--peak-fp8-tflops``, default 1979: the H100 SXM's), and its loss against bf16-mixed's. Off
  a GPU with float8 tensor cores the fp8 arms run in torchao's emulation with ``--reduced`` (the
  plumbing check) and are skipped with the reason otherwise.
- ``--sections data``: the convnet in bf16-mixed on images made per item (about 2 ms of one core
  each: :class:`MadeImages`), each runner with the loader a user writes first (no workers) and
  with its faster one: tuned by hand for the hand loop and Lightning (a worker per core but one,
  pinned memory, persistent workers), ptrain's dataloading advice applied for ptrain.
Writes ``OUT/gpu.json`` (every arm's raw figures) and ``OUT/gpu.md`` (the tables), and prints the
tables. ``--reduced`` shrinks every model and step count and, unless ``--precisions`` or
``--compile`` say otherwise, runs 32-true and bf16-mixed eager only, so the script runs on the CPU
in about a minute (``scripts/gpu-check.sh --reduced``, in the test suite); configurations the
device cannot run (TF32, cuDNN and 16-mixed off CUDA) are listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUNNERS = ("hand", "ptrain", "lightning")
PRECISIONS = ("32-true", "32-tf32", "16-mixed", "bf16-mixed", "bf16-true")
#: NVIDIA H100 SXM5, dense bf16 and float8 tensor-core peaks (no sparsity), in TFLOP/s
H100_BF16_DENSE_TFLOPS = 989.4
H100_FP8_DENSE_TFLOPS = 1978.9
#: the fp8 section's precisions: float8 and its reference
FP8_PRECISIONS = ("bf16-mixed", "fp8-mixed")
#: the first compute capability with float8 tensor cores (Ada; Hopper is 9.0)
FLOAT8_CAPABILITY = (8, 9)
LAST_STEPS = 5
#: what --reduced runs unless --precisions says otherwise: one plain and one mixed precision
#: (every precision and compile run here too, given by name, in about 10 minutes)
REDUCED_PRECISIONS = ("32-true", "bf16-mixed")
#: every configuration --configs can name
CONFIGS = (*PRECISIONS, *(f"{p}+compile" for p in PRECISIONS), "32-true+cudnn-benchmark",
           "bf16-mixed+channels-last")


@dataclass(frozen=True)
class Arm:
    """One measured run, in its own process."""
    workload: str
    runner: str
    precision: str
    compile: bool = False
    cudnn_benchmark: bool = False
    channels_last: bool = False
    device: str = "cuda"
    reduced: bool = False
    steps: int = 40
    warmup: int = 10
    batch: int = 0  # 0: the workload's default
    loading: str = "memory"  # one of LOADINGS

    @property
    def label(self) -> str:
        extra = " +compile" if self.compile else ""
        extra += " +cudnn-benchmark" if self.cudnn_benchmark else ""
        extra += " +channels-last" if self.channels_last else ""
        extra += f" +{self.loading}-loader" if self.loading != "memory" else ""
        return f"{self.precision}{extra}"


#: how an arm's batches are loaded: ``memory``, the matrix's, a TensorDataset already made (no
#: loading cost); the data section's dataset makes each image per item (:class:`MadeImages`),
#: loaded ``naive`` (no workers, as a first loader is written), ``tuned`` by hand (workers,
#: pinned memory, persistent workers) or, for ptrain, ``advice``: the naive loader with the
#: dataloading callback's advice applied (``apply = true``)
LOADINGS = ("memory", "naive", "tuned", "advice")
#: the data section's loaders per runner
DATA_LOADINGS = {"hand": ("naive", "tuned"), "ptrain": ("naive", "advice"),
                 "lightning": ("naive", "tuned")}


# -- the workloads (built inside the arm's process) ----------------------------------------------


def decoder_sizes(reduced: bool) -> dict[str, int]:
    if reduced:
        return {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "batch": 4}
    return {"layers": 12, "d_model": 768, "heads": 12, "seq": 1024, "batch": 64}


def conv_sizes(reduced: bool) -> dict[str, int]:
    if reduced:
        return {"width": 8, "image": 32, "batch": 8, "classes": 4}
    return {"width": 64, "image": 128, "batch": 128, "classes": 8}


def wide_decoder_sizes(reduced: bool) -> dict[str, int]:
    """The fp8 section's decoder: every matmul at least 2048 wide."""
    if reduced:
        return {"layers": 2, "d_model": 64, "heads": 4, "seq": 64, "batch": 4}
    return {"layers": 8, "d_model": 2048, "heads": 16, "seq": 1024, "batch": 16}


def mlp_sizes(reduced: bool) -> dict[str, int]:
    return {"hidden": 64 if reduced else 256, "batch": 64}


def build_workload(arm: Arm):
    """``(model, dataset, batch size, units per sample)`` (units: tokens for the decoder, one
    image or one sample otherwise): the model built from seed 0, and a dataset of exactly the
    items the arm trains on, in order."""
    import torch
    from torch.utils.data import TensorDataset

    _, Decoder, ConvNet, MLP = model_classes()
    torch.manual_seed(0)
    n_items = arm.steps
    if arm.workload == "mlp":
        from sklearn.datasets import load_digits

        size = mlp_sizes(arm.reduced)
        batch = arm.batch or size["batch"]
        digits = load_digits()
        rows = torch.arange(batch * n_items) % len(digits.target)
        features = torch.tensor(digits.data, dtype=torch.float32)[rows] / 16
        labels = torch.tensor(digits.target)[rows]
        return MLP(size["hidden"]), TensorDataset(features, labels), batch, 1
    if arm.workload in ("decoder", "decoder-wide"):
        size = (decoder_sizes if arm.workload == "decoder" else wide_decoder_sizes)(arm.reduced)
        batch = arm.batch or size["batch"]
        model = Decoder(size["layers"], size["d_model"], size["heads"], size["seq"])
        text = stdlib_bytes(batch * n_items * (size["seq"] + 1))
        tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        tokens = tokens.view(batch * n_items, size["seq"] + 1)
        return model, TensorDataset(tokens), batch, size["seq"]
    size = conv_sizes(arm.reduced)
    batch = arm.batch or size["batch"]
    model = ConvNet(size["width"], size["classes"])
    if arm.loading != "memory":
        return model, made_images(arm, batch * n_items), batch, 1
    images, labels = stripe_images(batch * n_items, size["image"], size["classes"])
    return model, TensorDataset(images, labels), batch, 1


class MadeImages:
    """The convnet's images made per item, costing CPU time per item as decoding and augmenting
    does: item ``i`` is a stripe image (its class sets the angle) with noise, drawn from a
    generator seeded by ``i`` (the same item in every worker, runner and run) and blurred
    ``blurs`` times by a 5x5 kernel. A map-style dataset of ``n`` items, ``(image, label)``."""

    def __init__(self, n: int, size: int, classes: int, blurs: int):
        self.n, self.size, self.classes, self.blurs = n, size, classes, blurs

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch
        from torch.nn import functional as F

        if not 0 <= i < self.n:
            raise IndexError(i)
        g = torch.Generator().manual_seed(i)
        label = int(torch.randint(0, self.classes, (), generator=g))
        angle = torch.tensor(label * math.pi / self.classes)
        coords = torch.linspace(-1, 1, self.size)
        y, x = torch.meshgrid(coords, coords, indexing="ij")
        phase = float(torch.rand((), generator=g)) * 2 * math.pi
        wave = torch.sin(8 * (x * angle.cos() + y * angle.sin()) + phase)
        image = wave.expand(3, self.size, self.size) + 0.5 * torch.randn(
            3, self.size, self.size, generator=g)
        kernel = torch.full((3, 1, 5, 5), 1 / 25)
        for _ in range(self.blurs):
            image = F.conv2d(image[None], kernel, padding=2, groups=3)[0]
        return image.contiguous(), label


def stdlib_bytes(n: int) -> bytes:
    """``n`` bytes of the standard library's ``.py`` sources, in a fixed order (repeated if the
    library is shorter)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= n:
            break
    text = b"".join(chunks)
    return (text * (n // len(text) + 1))[:n]


def stripe_images(n: int, size: int, classes: int):
    """``n`` greyscale-in-RGB images of oriented stripes (the class sets the angle) with noise."""
    import torch

    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, classes, (n,), generator=g)
    angle = labels.float() * math.pi / classes
    coords = torch.linspace(-1, 1, size)
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    phase = torch.rand(n, 1, 1, generator=g) * 2 * math.pi
    wave = torch.sin(8 * (x * angle.cos()[:, None, None] + y * angle.sin()[:, None, None]) + phase)
    images = wave[:, None].expand(n, 3, size, size) + 0.5 * torch.randn(n, 3, size, size,
                                                                          generator=g)
    return images.contiguous(), labels


@functools.cache
def model_classes():
    """``(Block, Decoder, ConvNet, MLP)``, defined in an arm's process (the parent never builds
    a model)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads) \
                .permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    class Decoder(nn.Module):
        def __init__(self, layers: int, d: int, heads: int, seq: int, vocab: int = 256):
            super().__init__()
            self.embed, self.position = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.norm = nn.LayerNorm(d)
            for table in (self.embed, self.position):  # GPT-2's scale: logits start near 0
                nn.init.normal_(table.weight, std=0.02)

        def forward(self, tokens):
            x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1],
                                                                device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.T  # tied output layer

        @staticmethod
        def loss(model, batch):
            (tokens,) = batch
            logits = model(tokens[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())

    class Residual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return F.relu(self.body(x) + self.skip(x))

    class ConvNet(nn.Module):
        def __init__(self, width: int, classes: int):
            super().__init__()
            widths = [width, 2 * width, 4 * width, 8 * width]
            layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                       nn.BatchNorm2d(width), nn.ReLU()]
            cin = width
            for i, w in enumerate(widths):
                layers += [Residual(cin, w, 1 if i == 0 else 2), Residual(w, w, 1)]
                cin = w
            self.features = nn.Sequential(*layers)
            self.head = nn.Linear(cin, classes)

        def forward(self, images):
            return self.head(self.features(images).mean(dim=(2, 3)))

        @staticmethod
        def loss(model, batch):
            images, labels = batch
            return F.cross_entropy(model(images).float(), labels)

    class MLP(nn.Module):
        def __init__(self, hidden: int):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                     nn.ReLU(), nn.Linear(hidden, 10))

        def forward(self, features):
            return self.net(features)

        @staticmethod
        def loss(model, batch):
            features, labels = batch
            return F.cross_entropy(model(features).float(), labels)

    return Block, Decoder, ConvNet, MLP




# -- one arm -----------------------------------------------------------------------------------


class Clock:
    """Marks the end of each training step; synchronises the device only at the end of step
    ``warmup`` and of the last step, and keeps every loss as a device tensor."""

    def __init__(self, arm: Arm, device):
        self.arm, self.device = arm, device
        self.step, self.start, self.end = 0, None, None
        self.losses: list = []

    def mark(self, loss) -> None:
        import torch

        self.step += 1
        self.losses.append(loss.detach())
        if self.step in (self.arm.warmup, self.arm.steps):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            now = time.perf_counter()
            if self.step == self.arm.warmup:
                self.start = now
            else:
                self.end = now


def optimizer_for(params, device) -> Any:
    import torch

    fast = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, **fast)


def step_flops(model, loss_fn, dataset, batch: int, device, precision: str) -> float:
    """The FLOPs of one forward and backward at ``batch`` (counted on one sample, times the
    batch), on the eager model; the gradients it leaves are cleared."""
    from torch.utils.data import default_collate
    from torch.utils.flop_counter import FlopCounterMode

    sample = tuple(t.to(device) for t in default_collate([dataset[0]]))
    with FlopCounterMode(display=False) as counter, autocast(device, precision):
        loss_fn(model, sample).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops()) * batch


def channels_last_inputs(loss_fn):
    """``loss_fn`` with the batch's images made channels-last first (on the device)."""
    import torch

    def loss(model, batch):
        return loss_fn(model, tuple(t.contiguous(memory_format=torch.channels_last)
                                    if t.dim() == 4 else t for t in batch))

    return loss


def autocast(device, precision: str):
    import contextlib

    import torch

    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16,
             "fp8-mixed": torch.bfloat16}.get(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def module_of(base: type, model, loss_fn, loader, device) -> Any:
    """``model`` as a ``base`` (``ptrain.TrainModule`` or ``lightning.LightningModule``): the
    same training step, optimizer and loader under either trainer."""

    class Module(base):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, batch_idx):
            return loss_fn(self.net, batch)

        def configure_optimizers(self):
            return optimizer_for(self.parameters(), device)

        def train_dataloader(self):
            return loader

    return Module()


def float8_by_hand(model, emulate: bool) -> None:
    """What a user writes for float8 training with torchao: every Linear layer but the first and
    the last, of sizes float8 matmuls take, converted (the layers ptrain's fp8-mixed converts
    by default; its tensorwise recipe)."""
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    kept = {linears[0], linears[-1]}
    config = replace(Float8LinearConfig.from_recipe_name("tensorwise"), emulate=emulate)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: (
        name not in kept and m.in_features % 16 == 0 and m.out_features % 16 == 0))


def run_hand(arm: Arm, model, loss_fn, loader, device, clock: Clock) -> None:
    import torch

    model.to(device)
    if arm.precision == "bf16-true":
        model.to(torch.bfloat16)
    if arm.precision == "fp8-mixed":
        float8_by_hand(model, emulate=device.type != "cuda")
    # forward and loss compiled together, as ptrain's compile plugin and Lightning compile the
    # whole training step
    step_loss = functools.partial(loss_fn, model)
    if arm.compile:
        step_loss = torch.compile(step_loss)
    optimizer = optimizer_for(model.parameters(), device)
    scaler = torch.amp.GradScaler(device.type, enabled=arm.precision == "16-mixed")
    model.train()
    floats = torch.bfloat16 if arm.precision == "bf16-true" else None
    for batch in loader:
        batch = tuple(t.to(device, dtype=floats if t.is_floating_point() else None,
                           non_blocking=True) for t in batch)
        with autocast(device, arm.precision):
            loss = step_loss(batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        clock.mark(loss)


def run_ptrain(arm: Arm, model, loss_fn, loader, device, clock: Clock) -> None:
    import ptrain

    class Marks:
        name = "gpu-benchmark-clock"

        @ptrain.hookimpl
        def on_train_batch_end(self, loss):
            clock.mark(loss)

    callbacks: list[Any] = ["no:progress-bar", "no:tensorboard", "no:checkpoint",
                            "no:model-summary", Marks()]
    plugin_options: dict[str, Any] = {}
    if arm.compile:
        callbacks.append("compile")
    if arm.channels_last:
        callbacks.append("channels-last")
    if arm.loading == "advice":
        plugin_options["dataloading"] = {"apply": True}
    if device.type == "cuda":
        plugin_options["cuda"] = {
            "float32_matmul_precision": "high" if arm.precision == "32-tf32" else "highest",
            "cudnn_benchmark": arm.cudnn_benchmark}
    if arm.precision == "fp8-mixed":
        plugin_options["fp8-mixed"] = {"emulate": device.type != "cuda"}
    precision = "32-true" if arm.precision == "32-tf32" else arm.precision
    trainer = ptrain.Trainer(accelerator=device.type, devices=1, precision=precision,
                             max_steps=arm.steps, max_epochs=1, callbacks=callbacks,
                             plugin_options=plugin_options, default_root_dir=os.environ["RUNS"])
    trainer.fit(module_of(ptrain.TrainModule, model, loss_fn, loader, device))


def run_lightning(arm: Arm, model, loss_fn, loader, device, clock: Clock) -> None:
    import lightning as L
    import torch

    class Marks(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.mark(outputs["loss"])

    module: Any = module_of(L.LightningModule, model, loss_fn, loader, device)
    if arm.compile:
        module = torch.compile(module)
    precision = "32-true" if arm.precision == "32-tf32" else arm.precision
    trainer = L.Trainer(accelerator=device.type, devices=1, precision=precision,
                        max_steps=arm.steps, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Marks()],
                        default_root_dir=os.environ["RUNS"])
    trainer.fit(module)


RUN = {"hand": run_hand, "ptrain": run_ptrain, "lightning": run_lightning}


def made_images(arm: Arm, n: int) -> MadeImages:
    """The data section's dataset of ``n`` images made per item (4 blurs an item: about 2 ms of
    one core each; 1 reduced)."""
    size = conv_sizes(arm.reduced)
    return MadeImages(n, size["image"], size["classes"], blurs=1 if arm.reduced else 4)


def loader_for(arm: Arm, dataset, batch: int, device):
    """The arm's DataLoader: the matrix's pins host memory on CUDA; the data section's
    ``naive`` one is the first loader a user writes (no workers, nothing pinned, also for
    ptrain's ``advice`` arm, whose callback rebuilds it), and ``tuned`` the one a careful user
    writes: a worker per core but one, pinned memory, workers kept between epochs."""
    from torch.utils.data import DataLoader

    common = {"batch_size": batch, "shuffle": False, "drop_last": True}
    if arm.loading == "memory":
        return DataLoader(dataset, pin_memory=device.type == "cuda", **common)
    if arm.loading == "tuned":
        workers = max(1, len(os.sched_getaffinity(0)) - 1)
        return DataLoader(dataset, num_workers=workers, pin_memory=device.type == "cuda",
                          persistent_workers=True, prefetch_factor=4, **common)
    return DataLoader(dataset, **common)


def measure(arm: Arm) -> dict[str, Any]:
    """Run ``arm`` in this process; its figures."""
    import resource

    import torch

    device = torch.device(arm.device)
    torch.set_float32_matmul_precision("high" if arm.precision == "32-tf32" else "highest")
    # cuDNN's convolutions use TF32 by torch's default, whatever the matmul precision: 32-true
    # means no TF32 anywhere, in every runner (ptrain leaves this setting alone)
    torch.backends.cudnn.allow_tf32 = arm.precision == "32-tf32"
    torch.backends.cudnn.benchmark = arm.cudnn_benchmark
    model, dataset, batch, per_sample = build_workload(arm)
    loss_fn = type(model).loss
    flops = step_flops(model.to(device), loss_fn, dataset, batch, device, arm.precision)
    model.to("cpu")
    if arm.channels_last and arm.runner != "ptrain":  # what a user writes; ptrain: the plugin
        model.to(memory_format=torch.channels_last)
        loss_fn = channels_last_inputs(loss_fn)
    loader = loader_for(arm, dataset, batch, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    clock = Clock(arm, device)
    started = time.perf_counter()
    RUN[arm.runner](arm, model, loss_fn, loader, device, clock)
    if clock.end is None:
        raise RuntimeError(f"{arm.runner} ran {clock.step} steps, not {arm.steps}")
    seconds = clock.end - clock.start
    steps = arm.steps - arm.warmup
    losses = torch.stack(clock.losses[-LAST_STEPS:]).float().cpu()
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"arm": asdict(arm), "seconds": seconds, "steps": steps,
            "samples_per_s": steps * batch / seconds,
            "units_per_s": steps * batch * per_sample / seconds,
            "flops_per_step": flops, "achieved_tflops": flops * steps / seconds / 1e12,
            "peak_bytes": peak, "final_loss": float(losses.mean()),
            "first_loss": float(clock.losses[0].float().cpu()),
            "wall_s": time.perf_counter() - started, "batch": batch,
            "torch": torch.__version__,
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.processor() or platform.machine())}


def run_child(child_args: list[str], out: Path, title: str,
              timeout_s: float) -> dict[str, Any]:
    """This script in a child process with ``child_args``; the figures it printed, or
    ``{"error": ...}``. Its stderr goes to ``out/arms.log``."""
    runs = tempfile.mkdtemp(prefix="gpu-benchmark-runs-")  # run folders: not kept
    env = {**os.environ, "RUNS": runs, "PYTHONUNBUFFERED": "1"}
    with open(out / "arms.log", "a") as log:
        log.write(f"\n=== {title}\n")
        log.flush()
        try:
            proc = subprocess.run([sys.executable, __file__, *child_args],
                                  stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                  cwd=REPO, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s"}
        finally:
            shutil.rmtree(runs, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode} (see arms.log)"}
    return json.loads(lines[-1][len("RESULT "):])


# -- the plan ----------------------------------------------------------------------------------


def why_not(arm: Arm) -> str | None:
    """Why ``arm`` cannot run on its device, or None."""
    if arm.device != "cuda":
        if arm.precision == "32-tf32" or arm.cudnn_benchmark:
            return "TF32 and cuDNN exist only on CUDA"
        if arm.precision == "16-mixed":
            return "16-mixed needs a GPU (its GradScaler has nothing to guard on the CPU)"
    if arm.precision == "fp8-mixed":
        if arm.runner == "lightning":
            return ("Lightning has no torchao float8 precision (its transformer-engine "
                    "precision needs NVIDIA's Transformer Engine)")
        if arm.device != "cuda" and not arm.reduced:
            return ("float8 matmuls need a CUDA GPU of compute capability 8.9 or newer (the "
                    "CPU emulates them only in the --reduced plumbing check)")
        if arm.device == "cuda":
            import torch

            if torch.cuda.get_device_capability() < FLOAT8_CAPABILITY:
                return (f"{torch.cuda.get_device_name()} has no float8 tensor cores (compute "
                        f"capability {torch.cuda.get_device_capability()})")
    if arm.runner == "lightning":
        import importlib.util

        if importlib.util.find_spec("lightning") is None:
            return "Lightning is not installed (pip install lightning==2.6.6)"
    return None


def matrix_arms(args: argparse.Namespace) -> list[Arm]:
    arms = []
    for workload in args.workloads:
        # (precision, compiled, cuDNN benchmark, channels-last)
        configs = [(p, c, False, False) for p in args.precisions for c in (False, True)]
        if workload == "conv" and "32-true" in args.precisions:
            configs.append(("32-true", False, True, False))
        if workload == "conv" and "bf16-mixed" in args.precisions:
            configs.append(("bf16-mixed", False, False, True))
        for precision, compiled, benchmark, channels_last in configs:
            if (args.compile == "off" and compiled) or (args.compile == "only" and not compiled):
                continue
            if args.configs and config_name(Arm(workload, "hand", precision, compiled, benchmark,
                                                channels_last)) not in args.configs:
                continue
            for runner in args.runners:
                arms.append(Arm(workload, runner, precision, compiled, benchmark, channels_last,
                                args.device, args.reduced, args.steps, args.warmup, args.batch))
    return arms


def fp8_arms(args: argparse.Namespace) -> list[Arm]:
    """The fp8 section: the wide decoder in bf16-mixed and fp8-mixed, eager and compiled (as
    ``--compile`` allows), for each runner."""
    compiled = {"both": (False, True), "off": (False,), "only": (True,)}[args.compile]
    return [Arm("decoder-wide", runner, precision, c, device=args.device, reduced=args.reduced,
                steps=args.steps, warmup=args.warmup, batch=args.batch)
            for c in compiled for precision in FP8_PRECISIONS for runner in args.runners]


def data_arms(args: argparse.Namespace) -> list[Arm]:
    """The data section: the convnet in bf16-mixed on :class:`MadeImages`, each runner with the
    naive loader and with its faster one (``DATA_LOADINGS``)."""
    return [Arm("conv", runner, "bf16-mixed", device=args.device, reduced=args.reduced,
                steps=args.steps, warmup=args.warmup, loading=loading)
            for runner in args.runners for loading in DATA_LOADINGS[runner]]


def config_name(arm: Arm) -> str:
    """The arm's configuration as ``--configs`` names it: its label without spaces
    (``bf16-mixed+compile``)."""
    return arm.label.replace(" ", "")


def run_matrix(args: argparse.Namespace, out: Path,
               arms: list[Arm] | None = None) -> list[dict[str, Any]]:
    """Each of ``arms`` (default: the matrix's) in its own process; their results."""
    results = []
    for arm in matrix_arms(args) if arms is None else arms:
        reason = why_not(arm)
        result = ({"skipped": reason} if reason else
                  run_child(["--child", json.dumps(asdict(arm))], out,
                            f"{arm.workload} {arm.runner} {arm.label}", args.timeout))
        result["arm"] = asdict(arm)
        results.append(result)
        print(f"  {arm.workload:8} {arm.runner:9} {arm.label:28} {summary(result)}", flush=True)
    return results


def summary(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    if "error" in result:
        return f"FAILED: {result['error']}"
    return (f"{result['samples_per_s']:10.1f} samples/s  loss {result['final_loss']:.4f}  "
            f"{result['peak_bytes'] / 2**30:.2f} GiB")


def largest_batch(device: str, reduced: bool, checkpointed: bool, max_batch: int) -> dict:
    """ptrain's ``batch-size-finder`` (``then=stop``) on the decoder in bf16-mixed, with or
    without ``-p activation-checkpointing`` on its blocks (runs in an arm's process)."""
    import torch
    from torch.utils.data import TensorDataset

    import ptrain

    arm = Arm("decoder", "ptrain", "bf16-mixed", device=device, reduced=reduced, steps=1)
    model, _, start, _ = build_workload(arm)
    seq = decoder_sizes(reduced)["seq"]
    rows = 3 * max_batch  # the finder's trials take 3 steps each
    text = stdlib_bytes(rows * (seq + 1))
    data = TensorDataset(torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
                         .view(rows, seq + 1))
    callbacks: list[Any] = ["no:progress-bar", "no:tensorboard", "no:checkpoint",
                            "batch-size-finder"]
    options: dict[str, Any] = {"batch-size-finder": {"then": "stop",
                                                     "max_batch_size": max_batch}}
    if checkpointed:
        callbacks.append("activation-checkpointing")
        options["activation-checkpointing"] = {"classes": ["Block"]}
    trainer = ptrain.Trainer(accelerator=device, devices=1, precision="bf16-mixed",
                             max_epochs=1, callbacks=callbacks, plugin_options=options,
                             default_root_dir=os.environ["RUNS"])
    loader = torch.utils.data.DataLoader(data, batch_size=start, drop_last=True)
    trainer.fit(module_of(ptrain.TrainModule, model, type(model).loss, loader,
                          torch.device(device)))
    finder = trainer.plugins.get("batch-size-finder")
    return {"checkpointed": checkpointed, "found": finder.found, "initial": finder.initial,
            "max_batch_size": max_batch, "trials": finder.trials}


def ac_section(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """The largest batch that fits, with and without activation checkpointing, each in its own
    process."""
    results = []
    for checkpointed in (False, True):
        request = {"device": args.device, "reduced": args.reduced,
                   "checkpointed": checkpointed, "max_batch": 8 if args.reduced else 2048}
        result = run_child(["--ac-child", json.dumps(request)], out,
                           f"activation checkpointing {checkpointed}", args.timeout)
        result.setdefault("checkpointed", checkpointed)
        results.append(result)
        state = "on " if checkpointed else "off"
        print(f"  activation checkpointing {state}: largest batch "
              f"{result.get('found', 'FAILED: ' + str(result.get('error')))}", flush=True)
    return results


# -- the report --------------------------------------------------------------------------------


def data_table(data: list[dict[str, Any]]) -> list[str]:
    """The data section's table: each runner's loaders against the hand loop's two."""
    hand = {r["arm"]["loading"]: r for r in data if r["arm"]["runner"] == "hand"}
    lines = ["### data loading (convnet, bf16-mixed, images made per item)", "",
             "| runner | loader | images/s | vs hand, naive loader | vs hand, tuned loader | "
             "final loss |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in data:
        a = r["arm"]
        if "skipped" in r or "error" in r:
            why = r.get("skipped") or f"FAILED: {r['error']}"
            lines.append(f"| {a['runner']} | {a['loading']} | {why} | | | |")
            continue
        ratios = [f"{r['units_per_s'] / hand[k]['units_per_s']:.2f}x"
                  if "units_per_s" in hand.get(k, {}) else "" for k in ("naive", "tuned")]
        lines.append(f"| {a['runner']} | {a['loading']} | {r['units_per_s']:,.0f} | "
                     f"{ratios[0]} | {ratios[1]} | {r['final_loss']:.4f} |")
    return lines + [""]


def fp8_table(fp8: list[dict[str, Any]], peak_tflops: float,
              peak_fp8_tflops: float) -> list[str]:
    """The fp8 section's table: each arm against bf16-mixed of its runner and compile."""
    bf16 = {(r["arm"]["runner"], r["arm"]["compile"]): r for r in fp8
            if r["arm"]["precision"] == "bf16-mixed"}
    lines = ["### fp8 (decoder-wide: float8 matmuls against bf16-mixed)", "",
             "| configuration | runner | tokens/s | vs bf16-mixed | MFU (bf16 peak) | "
             "MFU (fp8 peak) | peak memory | final loss | vs bf16-mixed |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in fp8:
        a = r["arm"]
        label = Arm(**a).label
        if "skipped" in r or "error" in r:
            why = r.get("skipped") or f"FAILED: {r['error']}"
            lines.append(f"| {label} | {a['runner']} | {why} | | | | | | |")
            continue
        base = bf16.get((a["runner"], a["compile"]), {})
        against = a["precision"] != "bf16-mixed" and "units_per_s" in base
        speed = f"{r['units_per_s'] / base['units_per_s']:.2f}x" if against else ""
        dloss = f"{r['final_loss'] - base['final_loss']:+.3f}" if against else ""
        fp8_mfu = (f"{r['achieved_tflops'] / peak_fp8_tflops:.1%}"
                   if a["precision"] == "fp8-mixed" else "")
        lines.append(f"| {label} | {a['runner']} | {r['units_per_s']:,.0f} | {speed} | "
                     f"{r['achieved_tflops'] / peak_tflops:.1%} | {fp8_mfu} | "
                     f"{r['peak_bytes'] / 2**30:.2f} GiB | {r['final_loss']:.4f} | {dloss} |")
    return lines + [""]


def tables(results: list[dict[str, Any]], ac: list[dict[str, Any]], peak_tflops: float,
           data: list[dict[str, Any]] = (), fp8: list[dict[str, Any]] = (),
           peak_fp8_tflops: float = H100_FP8_DENSE_TFLOPS) -> str:
    lines = []
    by_key = {}
    for r in results:
        a = r["arm"]
        by_key[(a["workload"], a["precision"], a["compile"], a["cudnn_benchmark"],
                a["channels_last"], a["runner"])] = r
    for workload in dict.fromkeys(r["arm"]["workload"] for r in results):
        unit = {"decoder": "tokens/s", "conv": "images/s"}.get(workload, "samples/s")
        lines += [f"### {workload}", "",
                  f"| configuration | runner | {unit} | vs hand | MFU | peak memory | "
                  f"final loss | vs hand |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in results:
            a = r["arm"]
            if a["workload"] != workload:
                continue
            label = Arm(**a).label
            if "skipped" in r or "error" in r:
                why = r.get("skipped") or f"FAILED: {r['error']}"
                lines.append(f"| {label} | {a['runner']} | {why} | | | | | |")
                continue
            hand = by_key.get((workload, a["precision"], a["compile"], a["cudnn_benchmark"],
                               a["channels_last"], "hand"), {})
            speed = (f"{r['units_per_s'] / hand['units_per_s']:.3f}x"
                     if "units_per_s" in hand and a["runner"] != "hand" else "")
            dloss = (f"{r['final_loss'] - hand['final_loss']:+.2e}"
                     if "final_loss" in hand and a["runner"] != "hand" else "")
            mfu = r["achieved_tflops"] / peak_tflops
            lines.append(f"| {label} | {a['runner']} | {r['units_per_s']:,.0f} | {speed} | "
                         f"{mfu:.1%} | {r['peak_bytes'] / 2**30:.2f} GiB | "
                         f"{r['final_loss']:.4f} | {dloss} |")
        lines.append("")
    if ac:
        lines += ["### activation checkpointing (decoder, bf16-mixed, ptrain)", "",
                  "| activation checkpointing | largest batch that fits |", "| --- | ---: |"]
        for r in ac:
            lines.append(f"| {'on' if r.get('checkpointed') else 'off'} | "
                         f"{r.get('found', 'FAILED: ' + str(r.get('error')))} |")
        lines.append("")
    if fp8:
        lines += fp8_table(list(fp8), peak_tflops, peak_fp8_tflops)
    if data:
        lines += data_table(list(data))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=False, help="where gpu.json and gpu.md go")
    parser.add_argument("--reduced", action="store_true",
                        help="tiny models and few steps: the CPU plumbing check")
    parser.add_argument("--device", default=None, help="cuda (default where torch sees one) "
                                                       "or cpu")
    parser.add_argument("--sections", default="matrix,ac,fp8,data",
                        help="matrix, ac, fp8, data (comma-separated)")
    parser.add_argument("--workloads", default="decoder,conv,mlp",
                        help="decoder, conv, mlp (comma-separated)")
    parser.add_argument("--runners", default=",".join(RUNNERS))
    parser.add_argument("--precisions", default=None,
                        help=f"default: all; with --reduced {','.join(REDUCED_PRECISIONS)}")
    parser.add_argument("--steps", type=int, default=None, help="steps per arm (default 40; "
                                                                "reduced 6)")
    parser.add_argument("--warmup", type=int, default=None, help="steps before the clock "
                                                                 "starts (default 10; reduced 2)")
    parser.add_argument("--batch", type=int, default=0,
                        help="samples per step (default: the workload's: decoder 64, conv 128)")
    parser.add_argument("--compile", choices=("both", "off", "only"), default=None,
                        help="the eager arms, the compiled ones, or both (default: both; "
                             "with --reduced off)")
    parser.add_argument("--configs", default="",
                        help="only these configurations, comma-separated, as the tables name "
                             "them without spaces (e.g. 32-true,bf16-mixed+compile,"
                             "32-true+cudnn-benchmark); default: every one of the selection")
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS,
                        help="the device's dense bf16 peak, for MFU (default: the H100 SXM's)")
    parser.add_argument("--peak-fp8-tflops", type=float, default=H100_FP8_DENSE_TFLOPS,
                        help="its dense float8 peak, for the fp8 section's MFU")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per arm")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ac-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.runners = [r for r in args.runners.split(",") if r]
    args.sections = [s for s in args.sections.split(",") if s]
    args.configs = [c for c in args.configs.split(",") if c]
    args.precisions_default = args.precisions is None
    args.precisions = [p for p in (args.precisions or ",".join(PRECISIONS)).split(",") if p]
    for name, chosen, valid in (("--workloads", args.workloads, ("decoder", "conv", "mlp")),
                                ("--runners", args.runners, RUNNERS),
                                ("--precisions", args.precisions, PRECISIONS),
                                ("--sections", args.sections, ("matrix", "ac", "fp8", "data")),
                                ("--configs", args.configs, CONFIGS)):
        bad = [c for c in chosen if c not in valid]
        if bad:
            parser.error(f"{name}: {', '.join(bad)} not among {', '.join(valid)}")
    if args.configs:  # they name precision and compile themselves
        if not args.precisions_default or args.compile is not None:
            parser.error("--configs names the precision and compile of each configuration: "
                         "give it without --precisions and --compile")
        args.precisions = [p for p in PRECISIONS
                           if any(c.split("+")[0] == p for c in args.configs)]
        args.compile = "both"
    elif args.reduced and args.precisions_default:
        args.precisions = list(REDUCED_PRECISIONS)
    if args.compile is None:
        args.compile = "off" if args.reduced else "both"
    if args.steps is None:
        args.steps = 6 if args.reduced else 40
    if args.warmup is None:
        args.warmup = 2 if args.reduced else 10
    if args.batch < 0:
        parser.error(f"--batch {args.batch} must be positive (0: the workload's own)")
    if not 0 < args.warmup < args.steps:
        parser.error(f"--warmup {args.warmup} must be between 0 and --steps {args.steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(measure(Arm(**json.loads(args.child)))), flush=True)
        return 0
    if args.ac_child:
        print("RESULT " + json.dumps(largest_batch(**json.loads(args.ac_child))), flush=True)
        return 0
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu.py: --device cuda, but torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    out = args.out or Path.cwd() / "gpu-benchmark"
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"gpu.py on {name}, torch {torch.__version__}, {args.steps} steps per arm "
          f"({args.warmup} warm-up){' [reduced]' if args.reduced else ''}", flush=True)
    results = run_matrix(args, out) if "matrix" in args.sections else []
    ac = ac_section(args, out) if "ac" in args.sections else []
    fp8 = run_matrix(args, out, fp8_arms(args)) if "fp8" in args.sections else []
    data = run_matrix(args, out, data_arms(args)) if "data" in args.sections else []
    report = tables(results, ac, args.peak_tflops, data, fp8, args.peak_fp8_tflops)
    header = (f"Device: {name}; torch {torch.__version__}; Python {platform.python_version()}; "
              f"MFU against {args.peak_tflops:g} TFLOP/s (dense bf16 peak)"
              f"{f' and {args.peak_fp8_tflops:g} (dense float8 peak)' if fp8 else ''}; command: "
              f"`python benchmarks/gpu.py {' '.join(argv if argv is not None else sys.argv[1:])}`")
    (out / "gpu.md").write_text(header + "\n\n" + report + "\n")
    (out / "gpu.json").write_text(json.dumps({"device": name, "torch": torch.__version__,
                                              "peak_tflops": args.peak_tflops,
                                              "peak_fp8_tflops": args.peak_fp8_tflops,
                                              "matrix": results, "ac": ac, "fp8": fp8,
                                              "data": data},
                                             indent=1))
    print("\n" + header + "\n\n" + report)
    failed = [r for r in results + ac + fp8 + data if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
