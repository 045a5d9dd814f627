"""The ``toggling`` plugin under multi-process strategies, with real gloo process groups of two
CPU ranks: nothing of torch or torch.distributed is replaced.

The module (``tests._toggle_ddp_models.ToggleGAN``) lets its generator accumulate over two
batches (``toggle_model(opt_g, sync_grad=False)`` on the window's first batch, ``sync_grad=True``
on its last) and steps a discriminator every batch. A callback wraps torch's default
all-reduce comm hook to count DDP's gradient all-reduces, and the module writes, per rank, what
each backward cost and the gradient it left.

Each 2-rank job costs a few seconds, so the jobs are module-scoped fixtures shared by the tests
that read them (and only started when a selected test asks for them).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

import ptrain
from ptrain.errors import ConfigError
from tests._campaigns import JOB_MODULES
from tests._toggle_ddp_models import G_WINDOW, CommCounter, ToggleGAN, read_backward_records

QUIET = ["no:progress-bar", "no:tensorboard"]
WORLD = 2
EPOCHS = 2
BATCH = 8  # per rank; the one-process runs take WORLD * BATCH
N = 64
#: a collective waits at most this long, so that a broken job can't hang for half an hour
SAFETY_TIMEOUT_S = 120.0
#: float32 sums over the same rows in another order: DDP against one process
ATOL = 1e-5


def prototype() -> ToggleGAN:
    """The one initial module every run starts from (a copy of it)."""
    torch.manual_seed(0)
    return ToggleGAN(n=N, batch_size=BATCH)


def batches_per_epoch() -> int:
    # a DistributedSampler splits N rows over WORLD ranks; each rank batches its shard by BATCH
    return math.ceil(math.ceil(N / WORLD) / BATCH)


def fresh(record_dir: Path | None = None, batch_size: int = BATCH) -> ToggleGAN:
    module = copy.deepcopy(prototype())
    module.record_dir = str(record_dir) if record_dir is not None else None
    module.batch_size = batch_size
    return module


def run_job(root: Path, strategy: str, precision: str = "32-true",
            extra_options: dict | None = None) -> dict:
    """``ToggleGAN`` trained for EPOCHS under ``strategy`` on WORLD ranks: the launching
    Trainer, the module (holding rank 0's trained weights) and each rank's backward records."""
    records = root / "records"
    records.mkdir(parents=True)
    module = fresh(records)
    trainer = ptrain.Trainer(
        strategy=strategy, devices=WORLD, accelerator="cpu", max_epochs=EPOCHS,
        precision=precision, callbacks=["toggling", CommCounter(), *QUIET],
        default_root_dir=str(root / "runs"),
        plugin_options={strategy: {"timeout": SAFETY_TIMEOUT_S}, **(extra_options or {})})
    trainer.fit(module)
    return {"trainer": trainer, "module": module, "records": read_backward_records(records)}


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("toggle-ddp"), "ddp")


@pytest.fixture(scope="module")
def zero1_job(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("toggle-zero1"), "zero1")


@pytest.fixture(scope="module")
def single_job(tmp_path_factory):
    """The same module in this one process, with every batch twice as large."""
    module = fresh(batch_size=WORLD * BATCH)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=EPOCHS,
                             callbacks=["toggling", *QUIET],
                             default_root_dir=str(tmp_path_factory.mktemp("toggle-single")))
    trainer.fit(module)
    return {"trainer": trainer, "module": module}


def plain_torch_reference(drop_window_start: bool = False) -> dict[str, torch.Tensor]:
    """The algorithm written out without ptrain, on batches of WORLD * BATCH rows: each batch
    the generator adds ``g_loss``'s gradient (its own parameters only) to its sum over the
    window of G_WINDOW batches, stepping at the window's end; then the discriminator takes an
    SGD step on ``d_loss``'s gradient with respect to its own parameters.
    ``drop_window_start``: the generator keeps only the window's last gradient, what a lost or
    overwritten accumulation would give."""
    module = fresh()
    real_rows, z_rows = module.train_set.tensors
    opt_g, opt_d = module.configure_optimizers()
    g_params = list(module.generator.parameters())
    d_params = list(module.discriminator.parameters())
    rows = WORLD * BATCH
    for _ in range(EPOCHS):
        pending = None
        for index, start in enumerate(range(0, N, rows)):
            real, z = real_rows[start:start + rows], z_rows[start:start + rows]
            grads = torch.autograd.grad(module.g_loss(z), g_params)
            if pending is None or drop_window_start:
                pending = list(grads)
            else:
                pending = [p + g for p, g in zip(pending, grads)]
            if (index + 1) % G_WINDOW == 0:
                for param, grad in zip(g_params, pending):
                    param.grad = grad
                opt_g.step()
                opt_g.zero_grad()
                pending = None
            for param, grad in zip(d_params, torch.autograd.grad(module.d_loss(real, z),
                                                                 d_params)):
                param.grad = grad
            opt_d.step()
            opt_d.zero_grad()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def expected_global_step() -> int:
    per_epoch = batches_per_epoch()
    return EPOCHS * (per_epoch + per_epoch // G_WINDOW)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                   prefix: str = "") -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a if k.startswith(prefix))


def assert_no_all_reduce_inside_sync_grad_false(records: dict[int, list[dict]]) -> None:
    """The comm hook's count over each backward: 0 inside ``sync_grad=False``, at least 1
    inside ``sync_grad=True``, the same on every rank."""
    assert sorted(records) == list(range(WORLD))
    per_epoch = batches_per_epoch()
    assert per_epoch % G_WINDOW == 0  # so that every window ends inside its epoch
    for rank, lines in records.items():
        assert len(lines) == EPOCHS * per_epoch * 2, rank  # a D and a G backward per batch
        assert all(line["hook_registered"] for line in lines), rank
    keys = [[(r["epoch"], r["batch_idx"], r["part"], r["sync"]) for r in records[rank]]
            for rank in range(WORLD)]
    assert all(k == keys[0] for k in keys), "the ranks ran different backward passes"
    unsynced = [r for r in records[0] if not r["sync"]]
    # the generator's first batch of every window, and nothing else
    assert [(r["part"], r["batch_idx"] % G_WINDOW) for r in unsynced] == \
        [("g", 0)] * (EPOCHS * per_epoch // G_WINDOW)
    deltas = {rank: [r["after"] - r["before"] for r in lines] for rank, lines in records.items()}
    for rank, lines in records.items():
        for line, delta in zip(lines, deltas[rank]):
            where = f"rank {rank}, epoch {line['epoch']}, batch {line['batch_idx']}, {line['part']}"
            if line["sync"]:
                assert delta >= 1, f"no gradient all-reduce in a sync_grad=True backward: {where}"
            else:
                assert delta == 0, f"{delta} all-reduces inside sync_grad=False: {where}"
    assert all(deltas[rank] == deltas[0] for rank in deltas), deltas


# ---------------------------------------------------------------------------------------------
# ddp


@pytest.mark.slow
@JOB_MODULES
def test_no_gradient_all_reduce_inside_sync_grad_false(ddp_job):
    assert_no_all_reduce_inside_sync_grad_false(ddp_job["records"])


@pytest.mark.slow
@JOB_MODULES
def test_sync_grad_false_gradients_stay_local_until_the_window_end_averages_them(ddp_job):
    """Each rank's gradient right after each backward: where it was all-reduced it is the same
    on every rank; inside ``sync_grad=False`` it is this rank's own (the ranks see different
    rows, so their gradients differ)."""
    records = ddp_job["records"]
    for ours, theirs in zip(records[0], records[1]):
        where = f"epoch {ours['epoch']}, batch {ours['batch_idx']}, {ours['part']}"
        ours_grad, theirs_grad = torch.tensor(ours["grad"]), torch.tensor(theirs["grad"])
        if ours["sync"]:
            torch.testing.assert_close(ours_grad, theirs_grad, atol=1e-6, rtol=1e-6,
                                       msg=lambda m, where=where: f"{where}: {m}")
        else:
            assert (ours_grad - theirs_grad).abs().max().item() > 1e-4, \
                f"{where}: sync_grad=False gave both ranks the same gradient"


@pytest.mark.slow
@JOB_MODULES
def test_ddp_with_toggling_trains_like_one_process_with_twice_the_batch(ddp_job, single_job):
    """shuffle=False: the DistributedSampler gives rank r the rows r, r+2, ...; batch k of the
    two ranks together is batch k of one process with twice the batch, the noise is in the rows
    and the losses are batch means, so the discriminator's and the accumulated generator's
    steps must be the same."""
    initial = prototype().state_dict()
    ddp, single = ddp_job["module"].state_dict(), single_job["module"].state_dict()
    reference = plain_torch_reference()
    assert ddp_job["trainer"].global_step == single_job["trainer"].global_step \
        == expected_global_step()
    # the one-process run does what the algorithm says ...
    torch.testing.assert_close(single, reference, atol=ATOL, rtol=0)
    # ... and two ranks do the same (the module here holds rank 0's weights)
    torch.testing.assert_close(ddp, single, atol=ATOL, rtol=0)
    # the run trained both parts far beyond the tolerance ...
    for part in ("generator.", "discriminator."):
        assert max_difference(ddp, initial, part) > 1000 * ATOL, part
    # ... and the generator's accumulation mattered: keeping only each window's last gradient
    # ends far from where this run ended
    assert max_difference(ddp, plain_torch_reference(drop_window_start=True),
                          "generator.") > 100 * ATOL


# ---------------------------------------------------------------------------------------------
# zero1: DDP with the optimizer state sharded


@pytest.mark.slow
@JOB_MODULES
def test_zero1_with_toggling_trains_like_one_process_with_twice_the_batch(zero1_job, single_job):
    assert_no_all_reduce_inside_sync_grad_false(zero1_job["records"])
    assert zero1_job["trainer"].global_step == expected_global_step()
    single = single_job["module"].state_dict()
    torch.testing.assert_close(zero1_job["module"].state_dict(), single, atol=ATOL, rtol=0)
    assert max_difference(single, prototype().state_dict()) > 1000 * ATOL


# ---------------------------------------------------------------------------------------------
# the FSDP strategies refuse manual optimization


@pytest.mark.slow
@JOB_MODULES
@pytest.mark.parametrize("strategy", ["fsdp", "zero2"])
def test_fsdp_strategies_refuse_manual_optimization_naming_ddp_and_zero1(strategy, tmp_path):
    trainer = ptrain.Trainer(strategy=strategy, devices=WORLD, accelerator="cpu", max_epochs=1,
                             callbacks=["toggling", *QUIET],
                             default_root_dir=str(tmp_path / "runs"),
                             plugin_options={strategy: {"timeout": SAFETY_TIMEOUT_S}})
    module = fresh()
    before = copy.deepcopy(module.state_dict())
    with pytest.raises(ConfigError, match="optimizes manually") as info:
        trainer.fit(module)
    message = str(info.value)
    for needle in ("ToggleGAN", strategy, "--strategy ddp", "zero1"):
        assert needle in message, message
    assert trainer.global_step == 0
    torch.testing.assert_close(module.state_dict(), before, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# 16-mixed on top of ddp and toggling


@pytest.mark.slow
@JOB_MODULES
def test_16_mixed_under_ddp_with_toggling_is_close_to_32_true(ddp_job, tmp_path):
    """float16 autocast and one loss scale shared by both optimizers, with the generator's
    gradient accumulated (scaled) across batches: within float16's tolerance of 32-true, no
    all-reduce inside sync_grad=False, and the scale updated once per batch without overflow."""
    mixed = run_job(tmp_path, "ddp", precision="16-mixed",
                    # a scale this small can't overflow here: no step is skipped
                    extra_options={"16-mixed": {"init_scale": 1024.0}})
    assert_no_all_reduce_inside_sync_grad_false(mixed["records"])
    assert mixed["trainer"].global_step == expected_global_step()
    reference = ddp_job["module"].state_dict()
    result = mixed["module"].state_dict()
    torch.testing.assert_close(result, reference, atol=5e-3, rtol=5e-3)
    assert max_difference(result, prototype().state_dict(), "generator.") > 20 * 5e-3
    checkpoint = torch.load(mixed["trainer"].last_checkpoint_path, weights_only=True)
    scaler = checkpoint["plugins"]["16-mixed"]
    assert scaler["scale"] == 1024.0
    assert scaler["_growth_tracker"] == EPOCHS * batches_per_epoch()
