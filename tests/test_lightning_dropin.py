"""Lightning programs run under ptrain by rewriting their import lines, against Lightning 2.6.6.

Each program in ``tests/lightning_programs`` imports ``lightning.pytorch`` and writes what it
ended with to ``result.json``. It runs twice in fresh processes: as written, under Lightning, and
with ``lightning.pytorch`` replaced by ``ptrain.lightning`` in its import lines and nothing else.
The results must match: the weights after training exactly (the same arithmetic in the same
order), the metrics' names and values, the checkpoints kept, the callback's hook order. Where
ptrain differs on purpose, the comparison applies the difference listed in
``docs/from-lightning.md`` and says so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the oracle: pip install lightning==2.6.6 (dev extra)")

PROGRAMS = Path(__file__).parent / "lightning_programs"
IMPORT_LINE = re.compile(r"^(\s*(?:import|from)\s+)(lightning\.pytorch|pytorch_lightning)\b",
                         re.MULTILINE)


BARE_IMPORT = re.compile(r"^(\s*import\s+)lightning(\s+as\s+\w+)", re.MULTILINE)


def ported(source: str) -> str:
    """``source`` with only its import lines switched to ``ptrain.lightning`` (also
    ``import lightning as L``, the ``lightning`` package itself)."""
    source = IMPORT_LINE.sub(r"\1ptrain.lightning", source)
    return BARE_IMPORT.sub(r"\1ptrain.lightning\2", source)


#: Appended to the oracle's copy of a program only. Lightning leaves the process group up when
#: a program ends, and at that exit gloo under torch 2.13 aborts the processes ("terminate called
#: without an active exception", 3 runs in 12 of ``ddp_logger_folder`` here) after the program
#: did all its work. Ending the group as torch asks programs to keeps the oracle's exit clean.
#: ptrain's copy gets nothing: how ptrain ends its group is part of what is tested.
ORACLE_EXIT = """

if __name__ == "__main__":  # appended by tests/test_lightning_dropin.py, see ORACLE_EXIT
    import torch.distributed
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
"""


def run_program(name: str, where: Path, framework: str, *args: str) -> dict:
    folder = where / framework
    folder.mkdir()
    script = folder / f"{name}.py"
    source = (PROGRAMS / f"{name}.py").read_text()
    script.write_text(source + ORACLE_EXIT if framework == "lightning" else ported(source))
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    env.pop("PTRAIN_TRACE", None)
    for name in [n for n in env if n.startswith(("SLURM_", "MASTER_", "TORCHELASTIC_"))
                 or n in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK")]:
        env.pop(name)  # the programs start their own processes, on this machine
    result = subprocess.run([sys.executable, str(script), str(folder), *args], cwd=folder,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{framework} {name}:\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-5000:]}"
    return json.loads((folder / "result.json").read_text())


def test_the_rewrite_touches_import_lines_only():
    source = ("import lightning.pytorch as pl\nfrom lightning.pytorch.callbacks import X\n"
              "x = 'lightning.pytorch'\n")
    assert ported(source) == ("import ptrain.lightning as pl\n"
                              "from ptrain.lightning.callbacks import X\nx = 'lightning.pytorch'\n")


def _close(a: dict, b: dict, rel: float) -> None:
    assert set(a) == set(b)
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=rel, abs=1e-7), key


#: Each test runs a program under ptrain and under Lightning (seconds to a minute): the default
#: run draws five.
DROP_IN_PAIRS = pytest.mark.campaign(family="drop-in pairs", sample=5)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    where = tmp_path_factory.mktemp("classifier")
    return (run_program("classifier", where, "lightning"),
            run_program("classifier", where, "ptrain"))


@DROP_IN_PAIRS
def test_classifier_trains_to_the_same_weights(classifier):
    lightning, ptrain = classifier
    assert ptrain["weights"] == lightning["weights"]
    assert ptrain["global_step"] == lightning["global_step"]
    assert ptrain["current_epoch"] == lightning["current_epoch"]
    assert ptrain["lr"] == lightning["lr"]  # ReduceLROnPlateau stepped on val_loss alike


@DROP_IN_PAIRS
def test_classifier_metrics_have_lightnings_names_and_values(classifier):
    lightning, ptrain = classifier
    _close(lightning["callback_metrics"], ptrain["callback_metrics"], rel=1e-6)
    _close(lightning["test"], ptrain["test"], rel=1e-6)
    assert ptrain["logged_names"] == lightning["logged_names"]


@DROP_IN_PAIRS
def test_classifier_keeps_the_same_checkpoints(classifier):
    lightning, ptrain = classifier
    # on purpose: ptrain keeps the top-k ranking in best_k_models.json beside the files
    assert [n for n in ptrain["checkpoints"] if n != "best_k_models.json"] == \
        lightning["checkpoints"]
    assert ptrain["best_model"] == lightning["best_model"]


@DROP_IN_PAIRS
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_gan_with_manual_optimization_matches(tmp_path, precision):
    lightning = run_program("gan", tmp_path, "lightning", precision)
    ptrain = run_program("gan", tmp_path, "ptrain", precision)
    # bitwise in bf16 too: this comparison found that autocast's weight cache went stale when
    # optimizers step inside training_step (test_true_and_bf16_mixed.py keeps that fixed)
    assert ptrain["weights"] == lightning["weights"]
    assert ptrain["global_step"] == lightning["global_step"]
    assert ptrain["epochs_ended"] == lightning["epochs_ended"] == 3  # the module's own hook
    _close(lightning["callback_metrics"], ptrain["callback_metrics"], rel=1e-6)


@pytest.mark.parametrize("setting", [
    pytest.param(("32-true", "1"), id="one-process"),
    pytest.param(("bf16-mixed", "1"), id="bf16-mixed"),
    pytest.param(("32-true", "2"), id="ddp-2", marks=pytest.mark.slow),
])
@DROP_IN_PAIRS
def test_a_custom_callback_sees_lightnings_hooks_in_lightnings_order(tmp_path, setting):
    lightning = run_program("hook_order", tmp_path, "lightning", *setting)["events"]
    ptrain = run_program("hook_order", tmp_path, "ptrain", *setting)["events"]
    # each source's own sequence is Lightning's; between a callback and the module, ptrain
    # calls the callbacks' methods of one loop event before the module's (documented)
    for source in ("cb:", "m:"):
        assert [e for e in ptrain if e.startswith(source)] == \
            [e for e in lightning if e.startswith(source)], source
    assert sorted(ptrain) == sorted(lightning)


@DROP_IN_PAIRS
def test_a_gradient_monitor_reads_the_last_steps_gradients_as_under_lightning(tmp_path):
    """Lightning clears the gradients before the next accumulation window's backward: a
    callback reading ``p.grad`` in ``on_train_batch_end`` (a gradient-norm monitor), and a
    program after ``fit``, find the last step's. ptrain cleared them right after the step, so
    such a monitor printed 0 (LightningMasterPro's notebook 7)."""
    lightning = run_program("gradient_monitor", tmp_path, "lightning")
    ptrain = run_program("gradient_monitor", tmp_path, "ptrain")
    assert None not in lightning["norms"] and lightning["after_fit"] is not None  # the oracle
    assert ptrain["norms"] == pytest.approx(lightning["norms"], rel=1e-6)
    assert ptrain["after_fit"] == pytest.approx(lightning["after_fit"], rel=1e-6)
    assert ptrain["zeroed_at_step"] == lightning["zeroed_at_step"]
    assert ptrain["weights"] == lightning["weights"]


@pytest.mark.parametrize("precision", ["bf16-true", "64-true"])
@DROP_IN_PAIRS
def test_a_tensor_made_in_forward_takes_the_true_precisions_dtype(tmp_path, precision):
    """Lightning's true precisions set torch's default dtype while the module steps: a table
    made in ``forward`` without a dtype is in it. Under ptrain's bf16-true it was float32, and
    the next layer's bfloat16 weight failed the matmul (Lightning's FP8 example's demo
    transformer stopped at its first step)."""
    lightning = run_program("lazy_table_true_precision", tmp_path, "lightning", precision)
    ptrain = run_program("lazy_table_true_precision", tmp_path, "ptrain", precision)
    assert ptrain == lightning


@DROP_IN_PAIRS
def test_a_stage_given_dataloaders_keeps_the_last_datamodule_as_lightning_does(tmp_path):
    """``predict(model, datamodule=dm)`` then ``predict(model, dataloaders=...)``: Lightning
    keeps ``dm`` as ``trainer.datamodule`` and runs its setup again; ptrain dropped it."""
    lightning = run_program("datamodule_kept", tmp_path, "lightning")
    ptrain = run_program("datamodule_kept", tmp_path, "ptrain")
    assert lightning["calls"] == lightning["after_first"] * 2  # the oracle
    assert ptrain == lightning


@DROP_IN_PAIRS
def test_classifier_in_bf16_mixed_matches(tmp_path):
    lightning = run_program("classifier", tmp_path, "lightning", "bf16-mixed")
    ptrain = run_program("classifier", tmp_path, "ptrain", "bf16-mixed")
    assert ptrain["weights"] == lightning["weights"]
    _close(lightning["callback_metrics"], ptrain["callback_metrics"], rel=1e-6)
    assert ptrain["logged_names"] == lightning["logged_names"]
    assert ptrain["best_model"] == lightning["best_model"]


@DROP_IN_PAIRS
def test_a_weight_used_twice_in_bf16_mixed_trains_as_under_lightning(tmp_path):
    """Lightning's autocast keeps no weight cache, so a weight used twice in a step sums its
    gradients in float32; ptrain.lightning turns ptrain's cache off to give the same weights."""
    lightning = run_program("two_views", tmp_path, "lightning", "bf16-mixed")
    ptrain = run_program("two_views", tmp_path, "ptrain", "bf16-mixed")
    assert ptrain == lightning


@DROP_IN_PAIRS
@pytest.mark.slow
def test_classifier_under_ddp_on_two_processes_matches(tmp_path):
    lightning = run_program("classifier", tmp_path, "lightning", "32-true", "2")
    ptrain = run_program("classifier", tmp_path, "ptrain", "32-true", "2")
    # torch DDP in both; the gradient all-reduce may add in another order: float tolerance
    assert ptrain["weights"] == pytest.approx(lightning["weights"], rel=1e-5)
    assert ptrain["global_step"] == lightning["global_step"]
    assert ptrain["current_epoch"] == lightning["current_epoch"]
    assert ptrain["logged_names"] == lightning["logged_names"]
    # val_acc is a torchmetrics Metric, synchronised across processes by itself in both, so
    # the same checkpoints are kept
    assert [n for n in ptrain["checkpoints"] if n != "best_k_models.json"] == \
        lightning["checkpoints"]
    # on purpose: ptrain reduces every logged value over the processes, Lightning (with
    # sync_dist=False) reports rank 0's; the test loss is the mean of two halves of the test set
    assert ptrain["test"]["test_loss"] == pytest.approx(lightning["test"]["test_loss"], rel=0.1)


@DROP_IN_PAIRS
@pytest.mark.slow
def test_gan_under_ddp_on_two_processes_matches(tmp_path):
    lightning = run_program("gan", tmp_path, "lightning", "32-true", "2")
    ptrain = run_program("gan", tmp_path, "ptrain", "32-true", "2")
    assert ptrain["global_step"] == lightning["global_step"]
    assert set(ptrain["callback_metrics"]) == set(lightning["callback_metrics"])
    # on purpose (docs/from-lightning.md): ptrain reduces every logged value over the
    # processes, where Lightning (sync_dist=False) reports rank 0's
    for name in ("g_loss_epoch", "d_loss_epoch"):
        assert ptrain["callback_metrics"][name] == \
            pytest.approx(lightning["callback_metrics"][name], rel=0.1)


@DROP_IN_PAIRS
def test_checkpoint_files_in_dirpath_weights_only_and_best_without_a_monitor(tmp_path):
    lightning = run_program("checkpoint_files", tmp_path, "lightning")
    ptrain = run_program("checkpoint_files", tmp_path, "ptrain")
    assert ptrain["files"] == lightning["files"]
    assert ptrain["best_model"] == lightning["best_model"]
    assert ptrain["best_score"] == pytest.approx(lightning["best_score"], rel=1e-6)
    assert ptrain["best_weights"] == lightning["best_weights"]
    _close(lightning["test"], ptrain["test"], rel=1e-6)
    # on purpose: ptrain keeps its top-k record beside the files
    assert [f for f in ptrain["plain_files"] if f != "best_k_models.json"] == \
        lightning["plain_files"]
    assert ptrain["plain_best"] == lightning["plain_best"]
    _close(lightning["plain_test"], ptrain["plain_test"], rel=1e-6)


@DROP_IN_PAIRS
def test_an_evaluation_without_a_model_uses_the_best_checkpoint_of_the_fit(tmp_path):
    """dl-fundamentals' unit 5 exercise tests with ``trainer.test(dataloaders=...)`` after fit:
    Lightning evaluates (and loads) the best checkpoint; ptrain evaluated the last weights."""
    lightning = run_program("evaluate_without_model", tmp_path, "lightning")
    ptrain = run_program("evaluate_without_model", tmp_path, "ptrain")
    assert lightning["best_weights"] != lightning["ended"]  # the best file is not the last state
    assert ptrain["best_model"] == lightning["best_model"]
    assert ptrain["ended"] == lightning["ended"]
    assert ptrain["after_test"] == lightning["after_test"] == lightning["best_weights"]
    for stage in ("test", "validate"):
        _close(lightning[stage], ptrain[stage], rel=1e-6)
    assert ptrain["predict"] == pytest.approx(lightning["predict"], rel=1e-6)
    assert lightning["warnings"] == ptrain["warnings"] == 3  # each stage says which weights
    # on purpose: Lightning stops without a checkpoint callback; ptrain evaluates the weights
    assert lightning["plain_test"] == {"error": "ValueError"}
    _close(ptrain["plain_given"], ptrain["plain_test"], rel=0)


@DROP_IN_PAIRS
def test_import_lightning_as_l_reaches_the_trainer_through_l_pytorch(tmp_path):
    """``import lightning as L`` becomes ``import ptrain.lightning as L``; the dl-fundamentals
    course's unit 7 notebooks then call ``L.pytorch.seed_everything(123)``, which was an
    AttributeError under ptrain."""
    lightning = run_program("bare_lightning_package", tmp_path, "lightning")
    ptrain = run_program("bare_lightning_package", tmp_path, "ptrain")
    assert lightning["same_classes"] and ptrain["same_classes"]
    assert ptrain["weights"] == lightning["weights"]
    assert ptrain["train_loss"] == pytest.approx(lightning["train_loss"], rel=1e-6)
    assert ptrain["checkpoint"] == lightning["checkpoint"]


@DROP_IN_PAIRS
def test_a_trainer_without_default_root_dir_reports_lightnings_absolute_paths(tmp_path):
    """Lightning's root is then the working directory, so its loggers' folders and checkpoint
    paths are absolute (Lightning's computer-vision fine-tuning example printed them); ptrain's
    were relative to the working directory."""
    lightning = run_program("default_paths", tmp_path, "lightning")
    ptrain = run_program("default_paths", tmp_path, "ptrain")
    assert all(absolute for absolute, _ in lightning["default"].values())
    assert ptrain == lightning


@DROP_IN_PAIRS
def test_optimizer_step_and_lr_scheduler_step_overrides_match(tmp_path):
    lightning = run_program("optimizer_hooks", tmp_path, "lightning")
    ptrain = run_program("optimizer_hooks", tmp_path, "ptrain")
    for model in ("WarmUp", "PerIteration", "CustomStep"):
        assert ptrain[model]["weights"] == lightning[model]["weights"], model
        assert ptrain[model]["lrs"] == lightning[model]["lrs"], model
        assert ptrain[model]["global_step"] == lightning[model]["global_step"], model
        assert ptrain[model]["val_loss"] == pytest.approx(lightning[model]["val_loss"],
                                                          rel=1e-6), model


@DROP_IN_PAIRS
def test_every_ddp_rank_finds_its_loggers_folder_where_lightnings_does(tmp_path):
    """After fit, rank 1's logger named a version folder of its own choosing, which did not
    exist (rank 0 chose the job's): a program reading its metrics.csv there failed."""
    seen = {}
    for framework in ("lightning", "ptrain"):
        run_program("ddp_logger_folder", tmp_path, framework)
        seen[framework] = [json.loads((tmp_path / framework / f"rank{r}.json").read_text())
                           for r in range(2)]
    assert seen["ptrain"] == seen["lightning"]
    assert seen["ptrain"][1]["metrics_csv"] and seen["ptrain"][1]["version"] == 0
    # the module's self.logger on rank 1 is the logger too (it was a stand-in naming nothing)
    assert seen["ptrain"][1]["module_logger"] == ["logs/m/version_0", 0]


@DROP_IN_PAIRS
def test_tensor_parallel_program_matches(tmp_path):
    """ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2) on 4 processes: the
    module sees Lightning's mesh names, and ptrain's model-parallel trains it as Lightning does."""
    lightning = run_program("tensor_parallel", tmp_path, "lightning")
    ptrain = run_program("tensor_parallel", tmp_path, "ptrain")
    assert ptrain["mesh"] == lightning["mesh"] == ["data_parallel", "tensor_parallel"]
    assert ptrain["global_step"] == lightning["global_step"] == 6
    for result in (lightning, ptrain):
        first, _, third, _ = result["losses"]
        # a tensor-parallel pair reads the same batches, the two data-parallel replicas others
        assert result["losses"] == [first, first, third, third] and first != third
    # the same arithmetic in the same order: equal to the last bit (seen so on this CPU)
    assert ptrain["losses"] == lightning["losses"]
    assert ptrain["weights"] == lightning["weights"]


@DROP_IN_PAIRS
def test_a_trainer_knows_its_process_ranks_before_fit(tmp_path):
    """Each process the script launcher runs answers its own ranks and the world size as soon
    as the trainer is made, so ``trainer.print`` before ``fit`` prints once (Lightning's
    tensor-parallel example prints its parameter count there), not in every process."""
    lightning = run_program("ranks_before_fit", tmp_path, "lightning")
    ptrain = run_program("ranks_before_fit", tmp_path, "ptrain")
    assert ptrain["processes"] == lightning["processes"] == 2
    assert [r["global_rank"] for r in lightning["before"]] == [0, 1]
    assert [r["is_global_zero"] for r in lightning["before"]] == [True, False]
    assert [r["printed"] for r in lightning["before"]] == ["made\n", ""]
    assert ptrain["before"] == lightning["before"]


@DROP_IN_PAIRS
def test_the_tuner_under_ddp_sets_every_rank_what_rank_zero_found(tmp_path):
    """Each rank searched in a scratch folder of its own, where only rank 0's finder wrote its
    result: rank 1 died after the search."""
    seen = {}
    for framework, args in (("lightning", ()), ("ptrain", ("scale",))):
        run_program("ddp_tuner", tmp_path, framework, *args)
        seen[framework] = [json.loads((tmp_path / framework / f"rank{r}.json").read_text())
                           for r in range(2)]
    for ranks in seen.values():
        assert ranks[0] == ranks[1]
    ptrain, lightning = seen["ptrain"][0], seen["lightning"][0]
    assert ptrain["points"] == lightning["points"] == 30
    # on purpose (docs/from-lightning.md): ptrain's test reads the loss averaged over the
    # processes, Lightning's rank 0's; so the suggestions differ
    assert 1e-8 < ptrain["lr"] < 1
    assert ptrain["batch_size"] == ptrain["model_batch_size"] > 8
    assert ptrain["global_step"] == 2 * 512 // (2 * ptrain["batch_size"])


@DROP_IN_PAIRS
def test_several_evaluation_loaders_accumulation_and_a_prediction_writer_match(tmp_path):
    """Two validation, test and predict loaders from a DataModule's ``setup(stage)``, a fit
    that accumulates, clips and steps a scheduler per optimizer step, resumed with a callback's
    ``state_dict``. ``write_on_epoch_end`` got every predict loader's batches in one flat list
    (and their indices as one loader's) where Lightning gives one list per loader."""
    lightning = run_program("several_loaders", tmp_path, "lightning")
    ptrain = run_program("several_loaders", tmp_path, "ptrain")
    shapes = [[[8, 2]] * 4, [[5, 2]] * 6 + [[2, 2]]]  # a list of batches per loader
    assert lightning["predict"]["writer_epoch"]["shapes"] == shapes
    assert ptrain["predict"]["writer_epoch"] == lightning["predict"]["writer_epoch"]
    assert ptrain["predict"]["writer_batches"] == lightning["predict"]["writer_batches"]
    assert ptrain["weights"] == lightning["weights"]
    assert ptrain["resumed"]["loaded"] == lightning["resumed"]["loaded"] == {"batches": 24,
                                                                             "epochs": 2}
    for key in ("first", "resumed"):
        assert ptrain[key]["global_step"] == lightning[key]["global_step"]
        assert ptrain[key]["counter"] == lightning[key]["counter"]
        assert ptrain[key]["lr"] == pytest.approx(lightning[key]["lr"], rel=1e-12)
        _close(lightning[key]["metrics"], ptrain[key]["metrics"], rel=1e-6)
    for key in ("validate", "test"):
        assert len(ptrain[key]) == len(lightning[key]) == 2
        for mine, theirs in zip(ptrain[key], lightning[key]):
            _close(theirs, mine, rel=1e-6)
    assert ptrain["predict"]["shapes"] == lightning["predict"]["shapes"]
    assert ptrain["predict"]["sum"] == pytest.approx(lightning["predict"]["sum"], rel=1e-6)
    assert ptrain["stages"] == lightning["stages"]
