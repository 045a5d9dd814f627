"""Smoke uses of ``ptrain.lightning.profilers``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from lightning_names import refuses
from lightning_names._components import Regressor, trainer
from ptrain.lightning import profilers as p


class TimedRegressor(Regressor):
    def training_step(self, batch, batch_idx):
        with self.trainer.profiler.profile("my_forward"):
            return super().training_step(batch, batch_idx)


def _fit_timed(**options):
    torch.manual_seed(0)
    run = trainer(**options)
    run.fit(TimedRegressor())
    return run


def _simple():
    with tempfile.TemporaryDirectory() as root:
        profiler = p.SimpleProfiler(dirpath=root, filename="report")
        run = _fit_timed(profiler=profiler)
        assert run.profiler is profiler
        durations = profiler.recorded_durations
        assert len(durations["my_forward"]) == 4 and len(durations["model_step [train]"]) == 4
        assert len(durations["dataloader_next [train]"]) == 3  # the batches after the first
        report = (Path(root) / "fit-report.txt").read_text()
        assert "FIT Profiler Report" in report and "model_step [train]" in report
        assert "my_forward" in report and "Percentage %" in report
    assert "Percentage %" not in p.SimpleProfiler(extended=False).summary()


def _advanced():
    with tempfile.TemporaryDirectory() as root:
        profiler = p.AdvancedProfiler(dirpath=root, filename="perf", dump_stats=True)
        _fit_timed(profiler=profiler)
        report = (Path(root) / "fit-perf.txt").read_text()
        assert "Profile stats for: fit" in report and "(training_step)" in report
        assert (Path(root) / "fit-perf-fit.prof").stat().st_size > 0
    assert isinstance(trainer(profiler="advanced").profiler, p.AdvancedProfiler)
    standalone = p.AdvancedProfiler()
    with standalone.profile("standalone"):
        sorted(range(1000), key=str)
    assert "Profile stats for: standalone" in standalone.summary()


def _pass_through():
    run = _fit_timed()
    assert isinstance(run.profiler, p.PassThroughProfiler) and run.profiler.summary() == ""
    run = _fit_timed(profiler=p.PassThroughProfiler())
    assert run.global_step == 4


def _profiler():
    class Counting(p.Profiler):
        def __init__(self):
            super().__init__()
            self.events = []

        def start(self, action_name):
            self.events.append(("start", action_name))

        def stop(self, action_name):
            self.events.append(("stop", action_name))

        def summary(self):
            return str(self.events)

    counting = Counting()
    with counting.profile("x"):
        pass
    assert list(counting.profile_iterable([1, 2], "next")) == [1, 2]
    assert counting.events[:2] == [("start", "x"), ("stop", "x")] and len(counting.events) == 8
    refuses(lambda: trainer(profiler=Counting()), "Counting", "observe_hook_call")


def _pytorch():
    run = trainer(profiler=p.PyTorchProfiler(
        dirpath="traces", row_limit=5, sort_by_key="cpu_time_total", record_shapes=True,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)))
    options = run.config["plugins"]["profiler"]
    assert (options["dir"], options["row_limit"], options["sort_by"]) == ("traces", 5,
                                                                        "cpu_time_total")
    assert (options["wait"], options["warmup"], options["active"], options["repeat"],
            options["record_shapes"]) == (1, 1, 2, 1, True)
    assert trainer(profiler="pytorch").config["plugins"]["profiler"]["row_limit"] == 20
    refuses(lambda: p.PyTorchProfiler(filename="perf"), "filename")
    refuses(lambda: p.PyTorchProfiler(on_trace_ready=print), "on_trace_ready")


def _xla():
    refuses(lambda: p.XLAProfiler(), "XLAProfiler", "start_server")
    refuses(lambda: trainer(profiler="xla"), "XLAProfiler")


SMOKE = {
    "AdvancedProfiler": _advanced,
    "PassThroughProfiler": _pass_through,
    "Profiler": _profiler,
    "PyTorchProfiler": _pytorch,
    "SimpleProfiler": _simple,
    "XLAProfiler": _xla,
}
