"""The built-in ``model-summary`` callback: on by default, one table when ``fit`` starts, on rank 0
only; its counts for frozen layers, buffers, tied weights, dtypes and fsdp's sharded
parameters."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import ptrain
from ptrain.builtins.model_summary import ModelSummary, format_summary, human_count, summarize
from ptrain.config import DEFAULT_CALLBACKS
from ptrain.errors import ConfigError
from tests._cli_util import assert_ok, assert_usage_error
from tests._export_models import TiedLM
from tests.conftest import REPO, TinyRegressor, run_cli

QUIET = ["no:progress-bar", "no:tensorboard", "no:checkpoint"]
TOTALS = re.compile(r"^(\S+)\s+Total params$", re.M)


class Frozen(nn.Module):
    """A layer with 4*3+3 = 15 frozen parameters, one with 3*2+2 = 8 trainable ones, and a
    buffer of 100 elements (not a parameter: not counted)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        self.body.requires_grad_(False)
        self.head = nn.Linear(3, 2)
        self.register_buffer("stats", torch.zeros(100))


def test_counts_of_a_frozen_layer_and_a_buffer():
    rows, totals = summarize(Frozen())
    assert [(r.name, r.type, r.counts.total, r.counts.trainable, r.counts.frozen) for r in rows] \
        == [("body", "Sequential", 15, 0, 15), ("head", "Linear", 8, 8, 0)]
    assert (totals.trainable, totals.frozen, totals.total) == (8, 15, 23)
    assert totals.bytes == 23 * 4


def test_tied_weights_count_once_and_bytes_follow_the_dtype():
    rows, totals = summarize(TiedLM(width=8))
    by_name = {r.name: r.counts.total for r in rows}
    assert by_name == {"embed": 128, "mix": 72, "frozen": 72, "head": 128}  # head shows the tie
    assert (totals.trainable, totals.frozen, totals.total) == (200, 72, 272)
    half = nn.Sequential(nn.Linear(10, 10).to(torch.float16), nn.Linear(10, 1))
    assert summarize(half)[1].bytes == 110 * 2 + 11 * 4


def test_the_table_lines():
    text = format_summary(*summarize(Frozen()))
    header = "  | Name | Type       | Params | Trainable | Non-trainable"
    assert text.splitlines() == [
        header,
        "-" * len(header),
        "0 | body | Sequential | 15     | 0         | 15",
        "1 | head | Linear     | 8      | 8         | 0",
        "-" * len(header),
        "8         Trainable params",
        "15        Non-trainable params",
        "23        Total params",
        "0.000     Total estimated model params size (MB)",
    ]


def test_max_depth():
    deep = [r.name for r in summarize(Frozen(), max_depth=-1)[0]]
    assert deep == ["body", "body.0", "body.1", "head"]
    assert [r.name for r in summarize(Frozen(), max_depth=2)[0]] == deep
    rows, totals = summarize(Frozen(), max_depth=0)
    assert rows == [] and totals.total == 23
    assert format_summary(rows, totals).splitlines()[0] == "8         Trainable params"
    with pytest.raises(ConfigError, match="max_depth must be -1"):
        ModelSummary(max_depth=-2)


def test_human_counts():
    assert [human_count(n) for n in (0, 999, 1000, 1234, 2_500_000, 7_000_000_000)] == \
        ["0", "999", "1.0 K", "1.2 K", "2.5 M", "7.0 B"]


def test_on_by_default_printed_once_per_fit_not_in_validate(tmp_path, capsys):
    assert "model-summary" in DEFAULT_CALLBACKS
    trainer = ptrain.Trainer(accelerator="cpu", default_root_dir=str(tmp_path), callbacks=QUIET,
                             max_epochs=3)
    module = TinyRegressor()
    trainer.fit(module)
    out = capsys.readouterr().out
    assert TOTALS.findall(out) == ["5"]  # Linear(4, 1): 4 weights and a bias
    assert "0 | net  | Sequential | 5" in out
    assert trainer.plugins["model-summary"].text in out
    trainer.validate(module)
    assert "Total params" not in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Through the real CLI


def _cli_fit(root, *args: str):
    return run_cli("fit", "--model", "tests._export_models:TiedLM", "--accelerator", "cpu",
                   "--max-epochs", "1", "--no-progress-bar", "-p", "no:tensorboard",
                   "--default-root-dir", str(root), *args, cwd=REPO)


@pytest.mark.slow
def test_cli_default_option_and_off(tmp_path):
    on = _cli_fit(tmp_path / "on", "--model-summary-max-depth", "0")
    assert_ok(on)
    assert TOTALS.findall(on.stdout) == ["272"] and "| Name" not in on.stdout
    off = _cli_fit(tmp_path / "off", "-p", "no:model-summary")
    assert_ok(off)
    assert "Total params" not in off.stdout
    bad = _cli_fit(tmp_path / "bad", "--model-summary-max-depth", "-5")
    assert_usage_error(bad, "max_depth must be -1")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_only_rank_0_prints_and_fsdp_counts_global_sizes(tmp_path, strategy):
    """Two gloo ranks: one table, with the single-device counts (under fsdp every parameter is
    a DTensor holding half of the rows on each rank)."""
    if strategy == "fsdp":
        pytest.importorskip("ptrain_fsdp")
    result = _cli_fit(tmp_path, "--strategy", strategy, "--devices", "2", "-p", "no:checkpoint")
    assert_ok(result)
    assert TOTALS.findall(result.stdout) == ["272"]
    assert re.findall(r"^(\S+)\s+Trainable params$", result.stdout, re.M) == ["200"]
    assert "0 | embed  | Embedding | 128" in result.stdout


def test_no_per_step_hook():
    """On in every run, so it must cost nothing per step: it implements no per-step hook."""
    from ptrain.hook_calls import PER_STEP_HOOKS

    assert not [h for h in PER_STEP_HOOKS if hasattr(ModelSummary, h)]
