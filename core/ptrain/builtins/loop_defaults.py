"""The loop's default behaviour, as a plugin registered before every other (so called last).

Any plugin takes over one of these hooks by returning a value from its own implementation. This
plugin is not an entry point and can't be blocked: without it the loop has no defaults.

The per-step implementations take every argument of their hook, used or not: the direct caller
(``ptrain.hook_calls``) then calls them without an adapter.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from ptrain import checkpoint_io, run_folder
from ptrain.config import dump_hyperparameters
from ptrain.data import move_to_device
from ptrain.errors import CheckpointError, NoCheckpointYetError
from ptrain.hookspecs import hookimpl
from ptrain.meta_init import materialize
from ptrain.precision_policy import PrecisionPolicy

if TYPE_CHECKING:
    from ptrain.trainer import Trainer


#: The file, in the run folder, where the default ``log_hyperparams`` writes the hyperparameters.
HPARAMS_FILE = "hparams.toml"


class LoopDefaults:
    @hookimpl(trylast=True)
    def precision_policy(self) -> PrecisionPolicy:
        return PrecisionPolicy()

    @hookimpl(trylast=True)
    def module_init_context(self, empty_init: bool | None) -> Any:
        return torch.device("meta") if empty_init else None

    @hookimpl(trylast=True)
    def wrap_model(self, trainer: Trainer, model: torch.nn.Module) -> torch.nn.Module:
        materialize(model, trainer.device)  # layers made on the meta device (init_module)
        return model.to(trainer.device)

    @hookimpl(trylast=True)
    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    @hookimpl(trylast=True)
    def prepare_dataloader(self, dataloader: Any) -> Any:
        return dataloader

    @hookimpl(trylast=True)
    def evaluation_mode(self, trainer: Trainer) -> bool:
        trainer.model.eval()
        return True

    @hookimpl(trylast=True)
    def transfer_batch(self, trainer: Trainer, batch: Any) -> Any:
        return move_to_device(batch, trainer.device)

    @hookimpl(trylast=True)
    def model_step(self, trainer: Trainer, stage: str, batch: Any, batch_idx: int) -> Any:
        return trainer.model(stage, batch, batch_idx)

    @hookimpl(trylast=True)
    def backward(self, trainer: Trainer, loss: torch.Tensor) -> bool:
        loss.backward()
        return True

    @hookimpl(trylast=True)
    def clip_gradients(self, trainer: Trainer, optimizer: torch.optim.Optimizer) -> bool | None:
        if trainer.gradient_clip_val is None:  # a clips_every_step plugin left this step alone
            return None
        params = [p for group in optimizer.param_groups for p in group["params"]
                  if p.grad is not None]
        by_mesh = _by_mesh(params)
        if trainer.gradient_clip_algorithm == "value":
            for same_mesh in by_mesh:
                torch.nn.utils.clip_grad_value_(same_mesh, trainer.gradient_clip_val,
                                                foreach=True)
        elif len(by_mesh) <= 1:
            torch.nn.utils.clip_grad_norm_(params, trainer.gradient_clip_val, foreach=True)
        else:
            norm = _norm_across_meshes(by_mesh)
            for same_mesh in by_mesh:
                torch.nn.utils.clip_grads_with_norm_(same_mesh, trainer.gradient_clip_val, norm,
                                                     foreach=True)
        return True

    @hookimpl(trylast=True)
    def optimizer_step(self, trainer: Trainer, optimizer: torch.optim.Optimizer) -> bool:
        optimizer.step()
        return True

    @hookimpl(trylast=True)
    def reduce_metrics(self, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return metrics

    @hookimpl(trylast=True)
    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    @hookimpl(trylast=True)
    def log_hyperparams(self, trainer: Trainer, hyperparameters: dict[str, Any]) -> None:
        """``<run folder>/hparams.toml`` on global rank 0, when there are any (and, where the
        trainer's ``writes_hparams_without_loggers`` is false, a logger)."""
        if not (trainer.writes_hparams_without_loggers or trainer.loggers):
            return
        if trainer.is_global_zero and hyperparameters:
            path = trainer.run_dir / HPARAMS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dump_hyperparameters(hyperparameters), encoding="utf-8")

    @hookimpl(trylast=True)
    def save_checkpoint(self, trainer: Trainer, checkpoint: dict[str, Any], path: str) -> bool:
        if trainer.writes_run_files:
            checkpoint_io.atomic_save(checkpoint, path)
        return True

    @hookimpl(trylast=True)
    def save_checkpoint_in_background(self, trainer: Trainer, checkpoint: dict[str, Any],
                                      path: str) -> list[Callable[[], None]]:
        if not trainer.writes_run_files:
            return []
        snapshot = trainer.copy_for_background(checkpoint)
        return [lambda: checkpoint_io.atomic_save(snapshot, path)]

    @hookimpl(trylast=True)
    def resolve_ckpt_path(self, trainer: Trainer, ckpt_path: str) -> str:
        if ckpt_path == "best":  # answered by the checkpoint callback, which is not in this run
            raise CheckpointError(
                "ckpt_path='best' needs the checkpoint callback, which is blocked in this run "
                "(no:checkpoint): it is what records the best checkpoint. Remove no:checkpoint, "
                "or give a checkpoint's path or 'last'.")
        if ckpt_path == LAST_INTACT:
            return str(_last_intact(trainer))
        if ckpt_path != "last":
            return ckpt_path
        from ptrain.trainer import LAST_CHECKPOINT, run_folders

        root = Path(trainer.run_root)
        newer = []  # run folders without one, newer than the run resumed
        for run in run_folders(root):
            candidate = run / LAST_CHECKPOINT
            if candidate.exists():  # a file, or a folder of shards
                if newer and trainer.is_global_zero:
                    names = ", ".join(str(r) for r in newer)
                    print(f"ptrain: warning: ckpt_path='last': the newer run folder(s) {names} "
                          f"hold no {LAST_CHECKPOINT}, so 'last' is {candidate}, of an "
                          f"older run. Give a checkpoint's path to choose another.",
                          file=sys.stderr, flush=True)
                return str(candidate)
            newer.append(run)
        raise NoCheckpointYetError(f"ckpt_path='last' found no {LAST_CHECKPOINT} in any run folder "
                              f"under {str(root)!r} (the checkpoint callback writes it unless its "
                              f"save_last is off); give a checkpoint's path, or start without "
                              f"it (--ckpt-path, or ckpt_path in the --config file); `fit "
                              f"--ckpt-path auto` resumes when there is one, else starts anew.")

    @hookimpl(trylast=True)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return checkpoint_io.safe_load(path)

    @hookimpl(trylast=True)
    def verify_checkpoint(self, path: str) -> bool | None:
        if not Path(path).is_file():
            return None
        checkpoint_io.safe_load(path)
        return True


#: ``ckpt_path`` that resumes from the newest checkpoint that passes its integrity check
LAST_INTACT = "last-intact"


def _last_intact(trainer: Trainer) -> Path:
    """The newest intact checkpoint under ``trainer.run_root``: each run folder's
    ``last.ckpt``, newest run first, then its other checkpoints, newest first; every one passed
    over is said on stderr with why."""
    from ptrain.trainer import LAST_CHECKPOINT, run_folders

    root = Path(trainer.run_root)
    passed_over = 0
    says = run_folder.decides_for_job()  # each process of a launched job resolves it alike
    for run in run_folders(root):
        folder = run / LAST_CHECKPOINT.parent
        last = run / LAST_CHECKPOINT
        others = sorted((p for p in folder.glob("*.ckpt") if p != last),
                        key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
        for candidate in ([last] if last.exists() else []) + others:
            problem = _why_not_usable(trainer, candidate)
            if problem is None:
                if passed_over and says:
                    print(f"ptrain: ckpt_path='{LAST_INTACT}': using {candidate}, the "
                          f"newest intact checkpoint this run can resume from.",
                          file=sys.stderr, flush=True)
                return candidate
            passed_over += 1
            if says:
                print(f"ptrain: warning: ckpt_path='{LAST_INTACT}': passing over {candidate}, "
                      f"which {problem}.", file=sys.stderr, flush=True)
    raise CheckpointError(f"ckpt_path='{LAST_INTACT}' found no intact checkpoint that this run "
                          f"can resume from in any run folder under {str(root)!r}; start "
                          f"without it (--ckpt-path, or ckpt_path in the --config file).")


def _why_not_usable(trainer: Trainer, path: Path) -> str | None:
    """Why ``last-intact`` passes over the checkpoint at ``path`` (completing "which ..."), or
    ``None`` when it is intact and this run's plugins can resume from it (see
    ``verify_checkpoint``)."""
    try:
        verified = trainer.hook.verify_checkpoint(trainer=trainer, path=str(path))
    except CheckpointError as exc:
        return f"is not intact ({str(exc).split('. ')[0]})"
    if verified is None:
        return ("is not intact (a folder this run's strategy does not read)" if path.is_dir()
                else "is not intact (no plugin of this run reads its format)")
    if verified is False:
        return "this run's strategy can't resume from (it is of another strategy's format)"
    return None


def _by_mesh(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``params`` grouped by the device mesh their gradients are DTensors on (plain tensors
    together): torch's foreach kernels take one mesh at a time."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for param in params:
        groups.setdefault(getattr(param.grad, "device_mesh", None), []).append(param)
    return list(groups.values())


def _norm_across_meshes(by_mesh: list[list[torch.Tensor]]) -> torch.Tensor:
    """The 2-norm of all the gradients of ``by_mesh`` (see :func:`_by_mesh`), as one plain
    tensor, equal on every process.

    A tensor-parallel model sharded by FSDP holds DTensors on the whole mesh (the
    tensor-parallel layers) and on its data-parallel part (the others), which torch's norm
    can't combine. Each process sums the squares of its local parts, each divided by the number
    of processes holding the same part (those of its replicated dimensions, and the other
    copies of a smaller mesh), and one all-reduce over the job adds them up.
    """
    import torch.distributed as dist

    if any(placement.is_partial() for same_mesh in by_mesh for p in same_mesh
           for placement in getattr(p.grad, "placements", ())):
        # a gradient still to be summed over processes: torch's norm per mesh, made whole
        return torch.nn.utils.get_total_norm(
            [_whole(torch.nn.utils.get_total_norm([p.grad for p in same_mesh], 2.0))
             for same_mesh in by_mesh], 2.0)
    world = dist.get_world_size()
    squares, plain = [], []
    for same_mesh in by_mesh:
        grads = [p.grad for p in same_mesh]
        mesh = getattr(grads[0], "device_mesh", None)
        if mesh is None:
            plain.extend(grads)
            continue
        norms = torch._foreach_norm([g.to_local() for g in grads])
        for grad, norm in zip(grads, norms):
            copies = world // mesh.size()
            for dim, placement in enumerate(grad.placements):
                if placement.is_replicate():
                    copies *= mesh.size(dim)
            squares.append(norm.float().square() / copies)
    total = torch.stack(squares).sum()
    dist.all_reduce(total)
    if plain:
        total = total + torch.nn.utils.get_total_norm(plain, 2.0, foreach=True).float().square()
    return total.sqrt()


def _whole(total: torch.Tensor) -> torch.Tensor:
    """A norm that is a DTensor (partial on some mesh dimensions) as a plain tensor, reduced one
    dimension at a time: all at once, torch warns on every rank that it runs them in sequence."""
    if not hasattr(total, "redistribute"):
        return total
    from torch.distributed.tensor import Replicate

    placements = list(total.placements)
    for dim, placement in enumerate(placements):
        if placement.is_partial():
            placements[dim] = Replicate()
            total = total.redistribute(total.device_mesh, placements)
    return total.to_local()
