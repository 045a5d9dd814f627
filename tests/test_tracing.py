"""``PTRAIN_TRACE=1``: every hook call of a run printed to stderr (hook, each implementation that
ran with its time and result type, the call's result type), the per-step hooks the core calls
directly included; and nothing added to those direct calls when it is off."""

from __future__ import annotations

import re
from collections import Counter

import pytest

import ptrain
from ptrain.builtins.cpu import CPUAccelerator
from ptrain.builtins.loop_defaults import LoopDefaults
from ptrain.hook_calls import StepHooks
from ptrain.testing import HookRecorder, TinyModule, run_fit

LINE = re.compile(r"^ptrain trace: (?:\[rank (?P<rank>\d+)\] )?(?P<indent> *)(?P<hook>\w+)"
                  r"\((?P<args>.*)\) (?P<ms>\d+\.\d{3}) ms -> (?P<result>raised \w+|\w+) \| "
                  r"(?P<impls>.*)$")
IMPL = re.compile(r"(?P<plugin>[\w.-]+)(?P<wrapper> \(wrapper\))? (?P<ms>\d+\.\d{3}) ms"
                  r"(?: -> (?P<result>\w+)| raised (?P<error>\w+))?")
QUIET = ["-p", "no:progress-bar", "-p", "no:tensorboard"]


def parse(stderr: str) -> list[dict]:
    """The trace lines of ``stderr``, parsed; any trace line that does not parse fails."""
    lines = []
    for text in stderr.splitlines():
        if not text.startswith("ptrain trace:"):
            continue
        match = LINE.match(text)
        assert match, f"unparsable trace line: {text!r}"
        line = match.groupdict()
        line["depth"] = len(line["indent"]) // 2
        if line["impls"] == "no implementation":
            line["impls"] = []
        else:
            parts = line["impls"].split(", ")
            line["impls"] = [IMPL.fullmatch(p).groupdict() for p in parts]
            assert all(line["impls"]), text
        lines.append(line)
    return lines


def fit_args(tmp_path, *extra: str) -> list[str]:
    return ["fit", "--model", "ptrain.testing:TinyModule", "--model.n", "32", "--accelerator",
            "cpu", "--max-epochs", "1", "--default-root-dir", str(tmp_path), *QUIET, *extra]


def test_trace_prints_every_hook_call_of_a_fit_per_step_hooks_included(cli, tmp_path):
    result = cli(*fit_args(tmp_path), env={"PTRAIN_TRACE": "1"})
    assert result.returncode == 0, result.stderr
    assert "ptrain trace" not in result.stdout
    lines = parse(result.stderr)
    counts = Counter(line["hook"] for line in lines)
    # 32 samples in batches of 16: 2 training steps; 8 validation samples: 1 batch, run by the
    # sanity check and by the validation
    assert counts["transfer_batch"] == 4 and counts["model_step"] == 4
    assert counts["backward"] == counts["optimizer_step"] == counts["on_train_batch_end"] == 2
    for hook in ("launch", "setup_device", "precision_policy", "wrap_model", "wrap_optimizer",
                 "setup", "on_epoch_start", "on_validation_end", "reduce_metrics", "log_metrics",
                 "state_dict", "save_checkpoint", "on_epoch_end", "teardown"):
        assert counts[hook] >= 1, hook
    assert counts["prepare_dataloader"] == 2
    by_hook = {}
    for line in lines:
        by_hook.setdefault(line["hook"], []).append(line)
    backward = by_hook["backward"][0]
    assert backward["result"] == "bool"
    assert [(i["plugin"], i["result"]) for i in backward["impls"]] == [("loop-defaults", "bool")]
    transfer = by_hook["transfer_batch"][0]
    assert [i["plugin"] for i in transfer["impls"]] == ["cpu"] and transfer["result"] == "list"
    step = by_hook["model_step"][1]  # [0]: the sanity check's validation batch
    assert step["args"] == "stage='train', batch_idx=0" and step["result"] == "Tensor"
    assert by_hook["optimizer_step"][0]["impls"][0]["plugin"] == "loop-defaults"
    assert by_hook["launch"][0]["impls"][0]["plugin"] == "single-device"
    assert all(float(line["ms"]) >= 0 for line in lines)
    # the checkpoint written in on_epoch_end: printed first (it ends first), one level deeper
    order = [line["hook"] for line in lines]
    save, end = order.index("save_checkpoint"), order.index("on_epoch_end")
    assert save < end and lines[save]["depth"] == lines[end]["depth"] + 1
    assert [i["plugin"] for i in lines[end]["impls"]] == ["checkpoint"]


def test_the_trace_and_a_recorder_see_the_same_calls(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PTRAIN_TRACE", "1")
    recorder = HookRecorder()
    run_fit("bf16-mixed", recorder, module=TinyModule(n=32), root_dir=tmp_path, max_epochs=1)
    lines = parse(capsys.readouterr().err)
    assert Counter(line["hook"] for line in lines) == Counter(recorder.names())
    assert len(lines) == len(recorder.calls) > 30
    step = next(line for line in lines if line["hook"] == "model_step")
    assert [(i["plugin"], bool(i["wrapper"])) for i in step["impls"]] == [
        ("bf16-mixed", True), ("loop-defaults", False)]


def test_a_hook_that_raises_is_traced(monkeypatch, capsys, tmp_path):
    class Failing:
        name = "failing"

        @ptrain.hookimpl
        def on_epoch_end(self):
            raise RuntimeError("deliberate")

    monkeypatch.setenv("PTRAIN_TRACE", "1")
    with pytest.raises(RuntimeError, match="deliberate"):
        run_fit(Failing(), "no:checkpoint", root_dir=tmp_path, max_epochs=1)
    lines = parse(capsys.readouterr().err)
    [end] = [line for line in lines if line["hook"] == "on_epoch_end"]
    assert end["result"] == "raised RuntimeError"
    assert end["impls"][0]["plugin"] == "failing" and end["impls"][0]["error"] == "RuntimeError"
    assert lines[-1]["hook"] == "teardown"


def test_without_an_observer_the_per_step_calls_are_the_implementations_themselves(
        monkeypatch, make_trainer):
    monkeypatch.delenv("PTRAIN_TRACE", raising=False)
    hooks = StepHooks(make_trainer().pm)
    # a single implementation taking all of the hook's arguments is called as it is
    assert hooks.backward.__func__ is LoopDefaults.backward
    assert hooks.optimizer_step.__func__ is LoopDefaults.optimizer_step
    assert hooks.clip_gradients.__func__ is LoopDefaults.clip_gradients
    # and an implementation of a hook others implement too is still itself, not a timed wrapper
    cpu = make_trainer().pm.hook.transfer_batch.get_hookimpls()[-1]
    assert cpu.plugin_name == "cpu" and cpu.function.__func__ is CPUAccelerator.transfer_batch
    monkeypatch.setenv("PTRAIN_TRACE", "1")
    traced = StepHooks(make_trainer().pm)
    assert getattr(traced.backward, "__func__", None) is not LoopDefaults.backward
    recorded = StepHooks(make_trainer(callbacks=["no:progress-bar", HookRecorder()]).pm)
    assert getattr(recorded.backward, "__func__", None) is not LoopDefaults.backward


@pytest.mark.parametrize("value, traced", [("0", False), ("", False), ("off", False),
                                           ("true", True)])
def test_trace_values(monkeypatch, capsys, tmp_path, value, traced):
    monkeypatch.setenv("PTRAIN_TRACE", value)
    run_fit(module=TinyModule(n=16), root_dir=tmp_path, max_epochs=1)
    assert bool(parse(capsys.readouterr().err)) is traced


def test_an_unknown_trace_value_is_a_usage_error(cli, tmp_path):
    result = cli(*fit_args(tmp_path), env={"PTRAIN_TRACE": "maybe"})
    assert result.returncode == 2
    assert "PTRAIN_TRACE='maybe' is not understood" in result.stderr
    assert "PTRAIN_TRACE=1" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_each_process_of_a_two_rank_run_traces_its_calls(cli, tmp_path):
    """With the --trace flag (it sets PTRAIN_TRACE for the processes the strategy starts)."""
    result = cli(*fit_args(tmp_path, "--strategy", "ddp", "--devices", "2", "--trace"))
    assert result.returncode == 0, result.stderr
    lines = parse(result.stderr)
    assert {line["rank"] for line in lines if line["hook"] == "model_step"} == {"0", "1"}
    steps = [line for line in lines if line["hook"] == "model_step" and line["rank"] == "1"]
    assert steps and [i["plugin"] for i in steps[0]["impls"]][:1] == ["ddp"]
    assert steps[0]["impls"][0]["wrapper"]
