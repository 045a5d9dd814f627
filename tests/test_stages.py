"""``test`` and ``predict`` beside ``fit``/``validate``, the sanity check before training, and the
debugging options (``fast_dev_run``, ``overfit_batches``, ``limit_test/predict_batches``,
``deterministic``): through the Python API, the CLI and, where processes matter, 2 gloo ranks."""

from __future__ import annotations

import collections
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import ptrain
from conftest import TinyRegressor
from tests._campaigns import TWO_PROCESS_RUNS
from tests._cli_util import assert_ok, assert_usage_error
from tests._stage_models import (BrokenValidation, LogsInPredict, NoPredictStep,
                                 StagedRegressor)
from tests.conftest import run_cli

QUIET = ["no:progress-bar", "no:tensorboard"]
STAGED = "tests._stage_models:StagedRegressor"


def trainer(tmp_path, **options) -> ptrain.Trainer:
    options.setdefault("callbacks", QUIET)
    return ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path / "runs"), seed=0,
                          **options)


class StepRecorder:
    """Every model_step's stage, and the predict batches with their dataset indices."""

    name = "step-recorder"

    def __init__(self):
        self.steps: list[tuple[str, bool]] = []
        self.predicted: list[tuple[int, list[int] | None]] = []

    @ptrain.hookimpl
    def model_step(self, trainer, stage):
        self.steps.append((stage, trainer.sanity_checking))

    @ptrain.hookimpl
    def on_evaluation_batch_end(self, trainer, stage, outputs, batch_idx):
        if stage == "predict":
            self.predicted.append((batch_idx, trainer.batch_indices))


class StageRecorder(StepRecorder):
    """... and every published metric name, in order (a logger)."""

    name = "stage-recorder"

    def __init__(self):
        super().__init__()
        self.published: list[str] = []

    @ptrain.hookimpl
    def log_metrics(self, metrics):
        self.published.extend(metrics)


# -- test --------------------------------------------------------------------------------------


def test_test_returns_the_metrics_averaged_over_the_test_set(tmp_path):
    module = StagedRegressor()
    [metrics] = trainer(tmp_path).test(module)
    x, y = module.test_set.tensors
    with torch.no_grad():
        # per-batch means averaged weighted by batch size (8, 8, 4 samples), as Lightning
        # does: the mean over the test set, whatever the batching
        expected = nn.functional.mse_loss(module(x), y)
    assert set(metrics) == {"test_loss"}
    assert metrics["test_loss"] == pytest.approx(float(expected), rel=1e-6)


def test_test_without_test_step_or_data_is_a_model_error(tmp_path):
    with pytest.raises(ptrain.ModelError, match="has no test_step"):
        trainer(tmp_path).test(TinyRegressor())

    class NoTestData(StagedRegressor):
        def test_dataloader(self):
            return None

    with pytest.raises(ptrain.ModelError, match="no test data: implement test_dataloader"):
        trainer(tmp_path).test(NoTestData())


def test_fit_without_configure_optimizers_is_a_model_error_naming_the_method(tmp_path):
    """A module without configure_optimizers (here a typo) is a usage error before anything
    runs, naming the class, the method and the near-miss; not NotImplementedError."""

    class OptTypo(TinyRegressor):
        configure_optimizers = ptrain.TrainModule.configure_optimizers

        def configure_optimizer(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(ptrain.ModelError, match=r"OptTypo has no configure_optimizers\(self\)"
                       r".*implement it.*OptTypo has configure_optimizer\(\): a typo"):
        trainer(tmp_path, max_epochs=1).fit(OptTypo())


class ValidationTypo(TinyRegressor):
    validation_step = ptrain.TrainModule.validation_step

    def validaton_step(self, batch, batch_idx):
        pass


class ValidationData(ptrain.DataModule):
    def train_dataloader(self):
        return TinyRegressor().train_dataloader()

    def val_dataloader(self):
        return TinyRegressor().val_dataloader()


def said_of_validation_step(fit) -> list[str]:
    """The warnings about a missing validation_step that ``fit()`` gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    return [str(w.message) for w in caught if "validation_step" in str(w.message)]


def test_validation_data_without_validation_step_is_said_once(tmp_path):
    """Validation data and no validation_step: fit runs no validation, as Lightning, and says
    so once (the class, the missing method, its near-miss and how not to be told)."""
    said = said_of_validation_step(lambda: trainer(tmp_path, max_epochs=2).fit(ValidationTypo()))
    assert len(said) == 1, said
    assert said[0].startswith("ValidationTypo has no validation_step(self, batch, batch_idx), "
                              "so fit runs no validation and ValidationTypo.val_dataloader() is "
                              "not used. ValidationTypo has validaton_step(): a typo"), said
    assert "remove the validation data or pass limit_val_batches=0" in said[0], said
    said = said_of_validation_step(lambda: trainer(tmp_path, max_epochs=1).fit(
        ValidationTypo(), datamodule=ValidationData()))
    assert ["ValidationData.val_dataloader() is not used" in s for s in said] == [True], said
    said = said_of_validation_step(lambda: trainer(tmp_path, max_epochs=1).fit(
        ValidationTypo(), val_dataloaders=TinyRegressor().val_dataloader()))
    assert ["the val_dataloaders given to fit is not used" in s for s in said] == [True], said
    # turned off, or no validation data: nothing to say
    assert not said_of_validation_step(lambda: trainer(
        tmp_path, max_epochs=1, limit_val_batches=0).fit(ValidationTypo()))

    class NoValidationData(ValidationTypo):
        val_dataloader = None

    assert not said_of_validation_step(lambda: trainer(tmp_path, max_epochs=1).fit(
        NoValidationData()))


class NoValidationData(TinyRegressor):
    val_dataloader = None  # Lightning's switch: the module gives none


class NoneGiven(TinyRegressor):
    def val_dataloader(self):
        return None


def test_a_validation_step_without_validation_data_is_said_once(tmp_path):
    """The other half, as Lightning says it: a validation_step that fit never calls, because
    there is no validation data, is said once, naming where the data would come from."""
    said = said_of_validation_step(lambda: trainer(tmp_path, max_epochs=1).fit(
        NoValidationData()))
    assert len(said) == 1, said
    assert said[0].startswith("NoValidationData has a validation_step, but fit has no "
                              "validation data (no val_dataloaders given to fit, and "
                              "NoValidationData has no val_dataloader()), so it runs no "
                              "validation."), said
    assert "pass limit_val_batches=0" in said[0], said
    said = said_of_validation_step(lambda: trainer(tmp_path, max_epochs=1).fit(NoneGiven()))
    assert ["NoneGiven.val_dataloader() returned None" in s for s in said] == [True], said
    # turned off, or validation data there: nothing to say
    assert not said_of_validation_step(lambda: trainer(
        tmp_path, max_epochs=1, limit_val_batches=0).fit(NoValidationData()))
    assert not said_of_validation_step(lambda: trainer(tmp_path, max_epochs=1).fit(
        NoValidationData(), val_dataloaders=TinyRegressor().val_dataloader()))


def test_limit_test_batches(tmp_path):
    recorder = StageRecorder()
    trainer(tmp_path, callbacks=[*QUIET, recorder], limit_test_batches=2).test(StagedRegressor())
    assert [stage for stage, _ in recorder.steps] == ["test", "test"]


# -- predict -----------------------------------------------------------------------------------


def batchwise(module, size: int) -> torch.Tensor:
    """The module's outputs on its prediction inputs, ``size`` rows at a time as predict's
    loader gives them: a matmul's last bits may depend on how many rows it takes (the CPU's
    kernels choose by shape), so the whole input at once is not the same computation."""
    with torch.no_grad():
        return torch.cat([module(x) for x in module.predict_x.split(size)])


def test_predict_returns_every_batch_output_on_the_cpu(tmp_path):
    module = StagedRegressor(predict_n=10, predict_batch=3)
    recorder = StageRecorder()
    predictions = trainer(tmp_path, callbacks=[*QUIET, recorder]).predict(module)
    assert [len(p["y"]) for p in predictions] == [3, 3, 3, 1]
    assert torch.equal(torch.cat([p["y"] for p in predictions]), batchwise(module, 3))
    assert recorder.predicted == [(0, [0, 1, 2]), (1, [3, 4, 5]), (2, [6, 7, 8]), (3, [9])]
    assert recorder.published == []  # predict publishes nothing


Output = collections.namedtuple("Output", "prediction scale")


class NamedTupleOutput(StagedRegressor):
    """Returns a namedtuple from ``predict_step``, as pytorch-forecasting's models do."""

    def predict_step(self, batch, batch_idx):
        y = super().predict_step(batch, batch_idx)["y"]
        return Output(prediction=y, scale=[y.abs().max()])


def test_predict_keeps_a_namedtuple_output_a_namedtuple(tmp_path):
    module = NamedTupleOutput(predict_n=5, predict_batch=3)
    predictions = trainer(tmp_path).predict(module)
    assert [type(p) for p in predictions] == [Output, Output]
    assert torch.equal(torch.cat([p.prediction for p in predictions]), batchwise(module, 3))
    assert isinstance(predictions[1].scale, list) and predictions[1].scale[0].ndim == 0


class DictSubclassOutput(StagedRegressor):
    """Returns an ``OrderedDict`` holding a ``defaultdict`` from ``predict_step``."""

    def predict_step(self, batch, batch_idx):
        y = super().predict_step(batch, batch_idx)["y"]
        extra = collections.defaultdict(list, scale=y.abs().max())
        return collections.OrderedDict(prediction=y, extra=extra)


def test_predict_keeps_a_dict_subclass_output_of_its_type(tmp_path):
    """Lightning keeps them; they came back plain dicts (a defaultdict without its factory)."""
    predictions = trainer(tmp_path).predict(DictSubclassOutput(predict_n=5, predict_batch=3))
    assert [type(p) for p in predictions] == [collections.OrderedDict] * 2
    extra = predictions[0]["extra"]
    assert type(extra) is collections.defaultdict and extra.default_factory is list
    assert extra["scale"].ndim == 0 and extra["missing"] == []


def test_predict_limits_and_return_predictions_false(tmp_path):
    module = StagedRegressor(predict_n=10, predict_batch=3)
    assert len(trainer(tmp_path, limit_predict_batches=2).predict(module)) == 2
    recorder = StageRecorder()
    result = trainer(tmp_path, callbacks=[*QUIET, recorder]).predict(module,
                                                                     return_predictions=False)
    assert result is None and len(recorder.predicted) == 4


def test_predict_usage_errors(tmp_path):
    with pytest.raises(ptrain.ModelError, match="has neither predict_step.* nor forward"):
        trainer(tmp_path).predict(NoPredictStep())
    with pytest.raises(ptrain.ModelError, match="self.log\\('oops', ...\\) was called in predict"):
        trainer(tmp_path).predict(LogsInPredict())


def test_prediction_writer_streams_each_batch_with_its_indices(tmp_path):
    module = StagedRegressor(predict_n=10, predict_batch=4)
    out = tmp_path / "preds"
    t = trainer(tmp_path, callbacks=[*QUIET, "prediction-writer"],
                plugin_options={"prediction-writer": {"output_dir": str(out)}})
    assert t.predict(module, return_predictions=False) is None
    files = sorted(out.glob("rank0-batch*.pt"))
    assert [f.name for f in files] == [f"rank0-batch{i:06d}.pt" for i in range(3)]
    records = [torch.load(f, weights_only=True) for f in files]
    assert [r["batch_indices"] for r in records] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert torch.equal(torch.cat([r["predictions"]["y"] for r in records]),
                       batchwise(module, 4))


@pytest.mark.parametrize("module_class", [NamedTupleOutput, DictSubclassOutput])
def test_prediction_writer_files_of_other_containers_load_weights_only(tmp_path, module_class):
    """A namedtuple or a dict subclass is written as a tuple or a dict: the file loads with
    ``weights_only=True``, which refuses those classes, as the writer promises."""
    module = module_class(predict_n=5, predict_batch=3)
    out = tmp_path / "preds"
    t = trainer(tmp_path, callbacks=[*QUIET, "prediction-writer"],
                plugin_options={"prediction-writer": {"output_dir": str(out)}})
    t.predict(module, return_predictions=False)
    records = [torch.load(f, weights_only=True) for f in sorted(out.glob("rank0-batch*.pt"))]
    first = [r["predictions"][0] if module_class is NamedTupleOutput else
             r["predictions"]["prediction"] for r in records]
    assert [type(r["predictions"]) for r in records] == \
        [tuple if module_class is NamedTupleOutput else dict] * 2
    assert torch.equal(torch.cat(first), batchwise(module, 3))


# -- the sanity check ---------------------------------------------------------------------------


def test_sanity_check_fails_a_broken_validation_step_before_any_training(tmp_path):
    module = BrokenValidation()
    t = trainer(tmp_path, max_epochs=3)
    with pytest.raises(RuntimeError, match="shape"):
        t.fit(module)
    assert module.train_steps == 0 and t.global_step == 0
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


@pytest.mark.parametrize("steps, expected", [(2, 2), (-1, 2), (1, 1), (0, 0)])
def test_sanity_check_runs_the_first_batches_publishes_nothing_and_keeps_the_rng(
        tmp_path, steps, expected):
    recorder = StageRecorder()
    # dropout and shuffling draw random numbers: the run must train as without a sanity check
    torch.manual_seed(0)
    module = TinyRegressor(dropout=0.3, shuffle=True, val_n=16)  # 2 validation batches
    t = trainer(tmp_path, callbacks=[*QUIET, recorder], max_epochs=2, num_sanity_val_steps=steps)
    t.fit(module)
    sanity = [s for s in recorder.steps if s[1]]
    assert sanity == [("validate", True)] * expected
    assert recorder.steps[:expected] == sanity  # before the first training step
    assert recorder.published.count("val_loss") == 2  # only the two real validations
    torch.manual_seed(0)
    reference = TinyRegressor(dropout=0.3, shuffle=True, val_n=16)
    trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0).fit(reference)
    for a, b in zip(module.parameters(), reference.parameters()):
        assert torch.equal(a, b)


# -- debugging options ----------------------------------------------------------------------------


@pytest.mark.parametrize("fast_dev_run, batches", [(True, 1), (3, 3)])
def test_fast_dev_run_runs_n_batches_of_each_stage_and_writes_nothing(tmp_path, fast_dev_run,
                                                                      batches):
    recorder, logger = StepRecorder(), StageRecorder()
    t = trainer(tmp_path, callbacks=["no:progress-bar", recorder, logger, "csv"], max_epochs=5,
                fast_dev_run=fast_dev_run)  # tensorboard and checkpoint stay on
    assert "stage-recorder" not in t.plugins and "csv" not in t.plugins  # loggers take no part
    module = StagedRegressor()
    t.fit(module)
    assert t.global_step == batches and t.current_epoch == 1  # one epoch run
    # the validation set has 2 batches
    assert [s for s, _ in recorder.steps] == ["train"] * batches + ["validate"] * min(batches, 2)
    t.test(module)
    t.predict(module)
    assert [s for s, _ in recorder.steps].count("test") == batches
    assert len(recorder.predicted) == batches
    assert logger.steps == [] and logger.published == []
    assert not (tmp_path / "runs").exists()  # no run folder, no checkpoint, no event file
    assert not t.log_dir.exists()  # the scratch folder plugins wrote into is gone


def test_overfit_batches_trains_and_validates_on_the_same_first_batches(tmp_path):
    class Seen(TinyRegressor):
        def __init__(self):
            super().__init__(n=64, batch_size=8, shuffle=True, val_n=40)
            self.batches: list[tuple[str, float]] = []

        def training_step(self, batch, batch_idx):
            self.batches.append(("train", float(batch[0][0, 0])))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            self.batches.append(("validate", float(batch[0][0, 0])))
            return super().validation_step(batch, batch_idx)

    module = Seen()
    with pytest.warns(UserWarning, match="overfit_batches: the training dataloader shuffles"):
        trainer(tmp_path, max_epochs=3, overfit_batches=2, num_sanity_val_steps=0).fit(module)
    x_train, x_val = module.train_set.tensors[0], module.val_set.tensors[0]
    epoch = ([("train", float(x_train[0, 0])), ("train", float(x_train[8, 0]))]
             + [("validate", float(x_val[0, 0])), ("validate", float(x_val[8, 0]))])
    assert module.batches == epoch * 3


def test_deterministic_is_on_during_the_stage_and_restored_after(tmp_path):
    class Probe(TinyRegressor):
        seen: list[bool] = []

        def training_step(self, batch, batch_idx):
            self.seen.append(torch.are_deterministic_algorithms_enabled())
            return super().training_step(batch, batch_idx)

    assert not torch.are_deterministic_algorithms_enabled()
    module = Probe(n=16)
    trainer(tmp_path, max_epochs=1, deterministic=True).fit(module)
    assert module.seen == [True, True]
    assert not torch.are_deterministic_algorithms_enabled()


class NonDeterministicOp(TinyRegressor):
    """A step using an operation that declares it has no deterministic implementation, through
    torch's own alert (what torch's CUDA-only kernels call; no CPU kernel of torch 2.13 lacks a
    deterministic implementation)."""

    def training_step(self, batch, batch_idx):
        from torch._prims_common import alert_not_deterministic

        alert_not_deterministic("my_scatter_op")
        return super().training_step(batch, batch_idx)


def test_deterministic_names_the_op_without_a_deterministic_implementation(tmp_path):
    with pytest.raises(ptrain.ConfigError, match="my_scatter_op has no deterministic "
                                                 "implementation.*deterministic='warn'"):
        trainer(tmp_path, max_epochs=1, deterministic=True).fit(NonDeterministicOp(n=16))
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.warns(UserWarning, match="my_scatter_op"):
        trainer(tmp_path, max_epochs=1, deterministic="warn").fit(NonDeterministicOp(n=16))


@pytest.mark.parametrize("flag, value, needle", [
    ("--num-sanity-val-steps", "-2", "-1 for all"),
    ("--fast-dev-run", "maybe", "expected true or false"),
    ("--deterministic", "sometimes", "true, false or 'warn'"),
    ("--overfit-batches", "1.5", "fraction must be in [0, 1]"),
])
def test_debugging_option_values_are_checked(flag, value, needle):
    result = run_cli("fit", "--model", STAGED, flag, value)
    assert_usage_error(result, flag.lstrip("-").replace("-", "_"), needle)


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_test_and_predict_rebuild_the_model_from_the_checkpoint(tmp_path):
    root = tmp_path / "runs"
    fit = run_cli("fit", "--model", STAGED, "--model.lr", "0.05", "--accelerator", "cpu",
                  "--max-epochs", "2", "--default-root-dir", str(root), "--seed", "0",
                  "--no-progress-bar")
    assert_ok(fit)
    ckpt = root / "version_0" / "checkpoints" / "last.ckpt"
    test = run_cli("test", "--ckpt-path", str(ckpt), "--accelerator", "cpu",
                   "--default-root-dir", str(root))
    assert_ok(test)
    assert "test_loss=" in test.stdout
    predict = run_cli("predict", "--ckpt-path", "last", "--accelerator", "cpu",
                      "--default-root-dir", str(root), "--no-progress-bar")
    assert_ok(predict)
    written = [Path(line.split(" written to ")[1].split(" (")[0])
               for line in predict.stdout.splitlines() if " written to " in line]
    assert len(written) == 1
    predictions = torch.load(written[0], weights_only=True)
    module = StagedRegressor.load_from_checkpoint(str(ckpt))
    assert module.hparams["lr"] == 0.05
    size = len(predictions[0]["y"])
    assert torch.equal(torch.cat([p["y"] for p in predictions]), batchwise(module, size))
    # a second prediction into the same run folder takes a new name: the first one stays
    first = written[0].read_bytes()
    again = run_cli("predict", "--ckpt-path", "last", "--accelerator", "cpu",
                    "--default-root-dir", str(root), "--no-progress-bar")
    assert_ok(again)
    assert f" written to {written[0].with_name('predictions-1.pt')} " in again.stdout
    assert written[0].read_bytes() == first


def test_cli_usage_errors_of_the_stages(tmp_path):
    assert_usage_error(run_cli("predict", "--model", "tests._stage_models:NoPredictStep",
                               "--accelerator", "cpu", "--default-root-dir", str(tmp_path)),
                       "has neither predict_step", "nor forward")
    assert_usage_error(run_cli("test", "--accelerator", "cpu"), "no model given",
                       "--ckpt-path")
    assert_ok(run_cli("test", "--help"))


# -- under ddp, 2 gloo ranks -------------------------------------------------------------------------


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_predict_under_ddp_gathers_in_dataset_order_without_padding(tmp_path):
    # 11 samples in batches of 3: each rank gets 6 (one repeated to even them out)
    module = StagedRegressor(predict_n=11, predict_batch=3)
    t = trainer(tmp_path, strategy="ddp", devices=2,
                callbacks=[*QUIET, "prediction-writer"])
    predictions = t.predict(module)
    with torch.no_grad():
        expected = module(module.predict_x)
    assert [len(p["y"]) for p in predictions] == [3, 3, 3, 2]  # as one process batches them
    # each rank computed other rows together than one process does (see batchwise): the same
    # values to float32's precision; the order is checked exactly by each sample's own row
    assert torch.allclose(torch.cat([p["y"] for p in predictions]), expected, rtol=1e-6,
                          atol=1e-7)
    assert torch.equal(torch.cat([p["row"] for p in predictions]), module.predict_x[:, 0])
    written = sorted((t.log_dir / "predictions").glob("rank*-batch*.pt"))
    assert {f.name[:5] for f in written} == {"rank0", "rank1"}
    indices = [i for f in written for i in torch.load(f, weights_only=True)["batch_indices"]]
    assert sorted(set(indices)) == list(range(11)) and len(indices) == 12  # one repeat
    [metrics] = t.test(module)
    assert set(metrics) == {"test_loss"} and metrics["test_loss"] > 0


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_the_cli_stages_read_a_sharded_folder_with_the_flags_that_wrote_it(tmp_path):
    """validate/test/predict rebuild the model from an fsdp folder's meta.pt; a strategy that
    reads single files is told the flags that wrote it, which then work; under several
    processes rank 0 alone writes and names the predictions."""
    root = tmp_path / "runs"
    common = ["--accelerator", "cpu", "--default-root-dir", str(root), "--no-progress-bar"]
    assert_ok(run_cli("fit", "--model", STAGED, "--max-epochs", "1", "--strategy", "fsdp",
                      "--devices", "2", *common))
    assert_usage_error(run_cli("validate", "--ckpt-path", "last", *common),
                       "sharded checkpoint folder",
                       "written under --strategy fsdp --devices 2", "ptrain-consolidate")
    validated = run_cli("validate", "--ckpt-path", "last", "--strategy", "fsdp", "--devices",
                        "2", *common)
    assert_ok(validated)
    assert "val_loss=" in validated.stdout
    predicted = run_cli("predict", "--ckpt-path", "last", "--strategy", "fsdp", "--devices",
                        "2", *common)
    assert_ok(predicted)
    assert predicted.stdout.count(" written to ") == 1, predicted.stdout


# -- the DataModule's own hooks --------------------------------------------------------------------


def _calls(record: Path) -> list[str]:
    return record.read_text().splitlines()


def test_datamodule_prepare_data_setup_teardown_and_state(tmp_path):
    from tests._stage_models import RecordingData

    record = tmp_path / "calls.txt"
    t = trainer(tmp_path, max_epochs=1)
    t.fit(TinyRegressor(with_val=False), datamodule=RecordingData(str(record)))
    assert _calls(record) == ["0 prepare_data", "0 setup fit", "0 train_dataloader",
                              "0 teardown fit"]
    record.unlink()
    checkpoint = torch.load(t.last_checkpoint_path, weights_only=True)
    assert checkpoint["datamodule_state"] == {"epochs_seen": 1}
    trainer(tmp_path, max_epochs=2).fit(TinyRegressor(with_val=False),
                                        datamodule=RecordingData(str(record)),
                                        ckpt_path=str(t.last_checkpoint_path))
    assert "0 load_state_dict 1" in _calls(record)


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_prepare_data_runs_once_per_machine_under_ddp(tmp_path):
    from tests._stage_models import RecordingData

    record = tmp_path / "calls.txt"
    trainer(tmp_path, max_epochs=1, strategy="ddp", devices=2).fit(
        TinyRegressor(with_val=False), datamodule=RecordingData(str(record)))
    calls = _calls(record)
    assert calls.count("0 prepare_data") == 1 and not any("1 prepare_data" in c for c in calls)
    # every process set up only after the data was prepared
    assert calls.index("0 prepare_data") < min(calls.index("0 setup fit"),
                                               calls.index("1 setup fit"))


def _on_a_terminal(*args: str) -> str:
    """Run the real ``ptrain`` with its stdout on a pseudo-terminal; what it drew there (read
    while it runs: a full terminal buffer would block it)."""
    import os
    import pty
    import subprocess
    import sys
    import threading

    from tests.conftest import REPO

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end is closed and everything was read
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "ptrain", *args], stdout=slave,
                              stderr=subprocess.PIPE, cwd=REPO, timeout=300, text=True)
    finally:
        os.close(slave)
        reader.join(timeout=30)
        os.close(master)
    assert proc.returncode == 0, proc.stderr
    return b"".join(chunks).decode(errors="replace")


def test_the_progress_bar_draws_test_and_predict_passes_with_prog_bar_metrics(tmp_path):
    common = ("--model", STAGED, "--accelerator", "cpu", "--default-root-dir", str(tmp_path))
    drawn = _on_a_terminal("test", *common)
    # the bar of the pass, with the running mean of what test_step logs with prog_bar=True
    assert "Testing" in drawn and "3/3" in drawn and "test_loss=" in drawn
    assert "Test finished in " in drawn
    drawn = _on_a_terminal("predict", *common)
    assert "Predicting" in drawn and "4/4" in drawn and "Prediction finished in " in drawn


# -- strategies and precisions apply to every stage ------------------------------------------------


def test_the_precision_applies_to_test_and_predict(tmp_path):
    module = StagedRegressor(predict_n=10, predict_batch=5)
    t = trainer(tmp_path, precision="bf16-mixed")
    predictions = t.predict(module)
    # the forward ran under bf16 autocast, as in training
    assert {p["y"].dtype for p in predictions} == {torch.bfloat16}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = batchwise(module, 5)
    assert torch.equal(torch.cat([p["y"] for p in predictions]), expected)
    [metrics] = t.test(module)
    assert set(metrics) == {"test_loss"}


@pytest.mark.slow
@TWO_PROCESS_RUNS
def test_predict_and_test_under_fsdp(tmp_path):
    module = StagedRegressor(predict_n=11, predict_batch=3)
    t = trainer(tmp_path, strategy="fsdp", devices=2)
    predictions = t.predict(module)
    with torch.no_grad():
        expected = module(module.predict_x)
    assert torch.allclose(torch.cat([p["y"] for p in predictions]), expected, atol=1e-6)
    [metrics] = t.test(module)
    assert set(metrics) == {"test_loss"} and metrics["test_loss"] > 0
