"""The accelerator plugins (``cuda``, ``mps``, ``tpu``/``xla``, ``hpu``) on a machine that has none
of their devices: what runs here is the listing, the availability messages, the refusal with a
usage error when one is selected, ``--accelerator auto`` falling back to ``cpu``, and the option
plumbing. The device and step logic runs in ``test_cuda_gpu.py`` (on a GPU) or not at all (TPU,
Gaudi: their libraries can't be installed here, and nothing of them is faked).

"Listing imports no device library" is proven by making the import fail: a folder first on
``PYTHONPATH`` holds a ``torch_xla`` and a ``habana_frameworks`` package whose ``__init__`` raises
ImportError. ``importlib.util.find_spec`` finds them (so the plugins say "installed but no device"),
and any import of them would surface as a broken plugin or a traceback.
"""

from __future__ import annotations

import glob
import importlib.util
import inspect
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ptrain
from _cli_util import REPO, CLIRuns, assert_ok, assert_usage_error, installed_names
from conftest import CLIResult, DIGITS_CONFIG
from tests.conftest import TinyRegressor

pytestmark = pytest.mark.slow

ACCELERATORS = ("cuda", "mps", "tpu", "hpu")
#: Where each plugin comes from (the distributions of plugins/accelerators/).
DISTRIBUTIONS = {"cuda": "ptrain-cuda", "mps": "ptrain-mps", "tpu": "ptrain-xla",
                 "hpu": "ptrain-habana", "xla": "ptrain-xla"}
FAKE_MARK = "must not be imported"
DIGITS = ["--config", DIGITS_CONFIG]

#: A TPU or Gaudi device here would make the plugins "ok" with the fake libraries.
TPU_PRESENT = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
                   or os.environ.get("TPU_NAME") or os.environ.get("TPU_ACCELERATOR_TYPE"))
HPU_PRESENT = bool(glob.glob("/dev/accel/accel*") or glob.glob("/dev/hl[0-9]*"))
REAL_XLA = importlib.util.find_spec("torch_xla") is not None
REAL_HABANA = importlib.util.find_spec("habana_frameworks") is not None


def expected_cuda_reason() -> str | None:
    """What the cuda plugin must say here, from torch's own build information."""
    if torch.version.cuda is None and torch.version.hip is None:
        return "CPU-only build"
    if torch.cuda.device_count() == 0:
        return "sees no GPU"
    return None


def expected_mps_reason() -> str | None:
    if platform.system() != "Darwin":
        return f"this is {platform.system()}"
    return None if torch.backends.mps.is_available() else "MPS"


@pytest.fixture(scope="module")
def fake_libs(tmp_path_factory):
    """A folder with ``torch_xla`` and ``habana_frameworks`` packages that fail on import."""
    root = tmp_path_factory.mktemp("fake-device-libs")
    for package in ("torch_xla", "habana_frameworks"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(
            f'raise ImportError("{package} {FAKE_MARK}: this is a test stand-in")\n')
    # the stand-ins are live: importing one from a process with them on the path fails
    proc = subprocess.run([sys.executable, "-c", "import torch_xla"], capture_output=True,
                          text=True, env={**os.environ, **fake_env(root)}, timeout=60)
    assert proc.returncode == 1 and FAKE_MARK in proc.stderr, proc.stderr
    return root


def fake_env(root) -> dict[str, str]:
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(root) + (os.pathsep + existing if existing else "")}


@pytest.fixture(scope="module")
def runs(request, fake_libs, tmp_path_factory):
    """Every CLI run of this module, started up front, two at a time; ``runs.dirs[key]`` is a
    fit run's --default-root-dir."""
    pool = CLIRuns(request)
    fake = fake_env(fake_libs)

    def fit(key: str, *args: str, used_by: tuple[str, ...], **kwargs) -> None:
        root = pool.dirs[key] = tmp_path_factory.mktemp(key) / "runs"
        pool.start(key, "fit", *DIGITS, "--default-root-dir", str(root), *args,
                   used_by=used_by, **kwargs)

    listing = ("test_listing_imports_no_device_library", "test_check_names_the_missing_library",
               "test_check_json_gives_the_same_statuses")
    pool.start("check", "plugins", "--check", used_by=listing)
    pool.start("fake-plain", "plugins", env=fake, used_by=listing)
    pool.start("fake-check", "plugins", "--check", env=fake, used_by=listing)
    pool.start("fake-check-json", "plugins", "--json", "--check", env=fake, used_by=listing)
    fit("fake-auto", "--accelerator", "auto", "--max-epochs", "1", "--limit-train-batches", "3",
        "--limit-val-batches", "1", "--no-progress-bar", "-p", "no:tensorboard", env=fake,
        used_by=("test_auto_on_the_command_line_trains_without_importing_device_libraries",))
    pool.start("fake-help", "fit", "--help-all", env=fake,
               used_by=("test_fit_help_groups_each_plugin_s_options",))
    yield pool
    pool.close()


def table_status(text: str) -> dict[tuple[str, str], str]:
    """``ptrain plugins`` table -> {(kind, name): status} (status "" without --check)."""
    lines = text.strip().splitlines()
    assert lines[0].split()[:4] == ["KIND", "NAME", "DISTRIBUTION", "VERSION"], lines[0]
    rows = {}
    for line in lines[1:]:
        parts = line.split(None, 4)
        rows[(parts[0], parts[1])] = parts[4] if len(parts) > 4 else ""
    return rows


def test_all_accelerator_plugins_are_installed():
    """The precondition of this module: otherwise its tests would check nothing."""
    assert set(ACCELERATORS) <= set(installed_names("accelerator"))
    assert "xla" in installed_names("strategy")


# ---------------------------------------------------------------------------------------------
# ptrain plugins (--check, --json)


def test_listing_imports_no_device_library(runs):
    """With a torch_xla and a habana_frameworks that raise on import first on the path, listing
    and checking succeed, never import them, and tpu/hpu say "installed but no device"."""
    if TPU_PRESENT or HPU_PRESENT:
        pytest.skip("a TPU or Gaudi device is present: the plugins would report ok")
    for key in ("fake-plain", "fake-check", "fake-check-json"):
        result = runs[key]
        assert_ok(result)
        assert FAKE_MARK not in result.stdout + result.stderr, key
    plain = table_status(runs["fake-plain"].stdout)
    assert {(k, n) for k, n in plain if k == "accelerator"} >= {("accelerator", a)
                                                                 for a in ACCELERATORS}
    statuses = table_status(runs["fake-check"].stdout)
    tpu, hpu, xla = (statuses[("accelerator", "tpu")], statuses[("accelerator", "hpu")],
                     statuses[("strategy", "xla")])
    assert tpu.startswith("unavailable: torch_xla is installed but no TPU was found"), tpu
    assert xla == tpu, (xla, tpu)
    assert hpu.startswith("unavailable: habana_frameworks is installed but no Gaudi device"), hpu
    assert statuses[("accelerator", "cpu")] == "ok"
    fake_json = {(r["kind"], r["name"]): r for r in json.loads(runs["fake-check-json"].stdout)}
    assert fake_json[("accelerator", "tpu")]["status"] == tpu
    assert fake_json[("accelerator", "hpu")]["status"] == hpu


def test_check_names_the_missing_library(runs):
    """Without the stand-ins, each plugin names why it can't run and what to install."""
    if REAL_XLA or REAL_HABANA:
        pytest.skip("torch_xla or habana_frameworks is really installed here")
    result = runs["check"]
    assert_ok(result)
    statuses = table_status(result.stdout)
    tpu = statuses[("accelerator", "tpu")]
    assert tpu.startswith("unavailable: torch_xla is not installed"), tpu
    assert "pip install 'torch_xla[tpu]'" in tpu
    assert torch.__version__.split("+")[0] in tpu  # the matching release is named by torch's
    assert statuses[("strategy", "xla")] == tpu
    hpu = statuses[("accelerator", "hpu")]
    assert hpu.startswith("unavailable: habana_frameworks is not installed"), hpu
    assert "Intel Gaudi" in hpu and "https://docs.habana.ai" in hpu
    cuda, reason = statuses[("accelerator", "cuda")], expected_cuda_reason()
    if reason is None:
        assert cuda == "ok", cuda
    else:
        assert cuda.startswith("unavailable:") and reason in cuda, cuda
        if reason == "CPU-only build":
            assert torch.__version__ in cuda and "install a CUDA build of torch" in cuda
    mps, reason = statuses[("accelerator", "mps")], expected_mps_reason()
    assert (mps == "ok") if reason is None else (mps.startswith("unavailable:") and reason in mps)
    assert statuses[("accelerator", "cpu")] == "ok"


def test_check_json_gives_the_same_statuses(runs):
    """``plugins --json --check``: the table's statuses as data, with each entry point's target."""
    result = runs["fake-check-json"]
    assert_ok(result)
    rows = json.loads(result.stdout)
    table = table_status(runs["fake-check"].stdout)
    by_key = {(r["kind"], r["name"]): r for r in rows}
    assert set(by_key) == set(table)
    for (kind, name), row in by_key.items():
        assert row["status"] == table[(kind, name)], (kind, name)
    for name in ACCELERATORS:
        assert by_key[("accelerator", name)]["distribution"] == DISTRIBUTIONS[name]
        assert by_key[("accelerator", name)]["status"].startswith("unavailable: ")
    assert by_key[("strategy", "xla")]["target"] == "ptrain_xla.strategy:XLAStrategy"
    assert by_key[("accelerator", "tpu")]["target"] == "ptrain_xla.accelerator:TPUAccelerator"
    assert by_key[("accelerator", "cuda")]["target"] == "ptrain_cuda:CUDAAccelerator"
    assert by_key[("accelerator", "hpu")]["target"] == "ptrain_habana:HPUAccelerator"


# ---------------------------------------------------------------------------------------------
# Selecting one that can't run


@pytest.fixture
def fit_in_process(tmp_path, monkeypatch, capsys):
    """``fit_in_process(*args)``: the real ``ptrain fit`` entry point (``ptrain.cli.main``, whose
    return value is the exit code) run in this process from the repository root, with
    ``--config`` the digits example's config and a fresh --default-root-dir; returns (result, root).
    Cheaper than a subprocess for runs that stop at plugin selection."""
    from ptrain.cli import main

    monkeypatch.chdir(REPO)

    def run(*args: str) -> tuple[CLIResult, Path]:
        root = tmp_path / f"runs{len(list(tmp_path.iterdir()))}"
        capsys.readouterr()
        code = main(["fit", *DIGITS, "--default-root-dir", str(root), *args])
        out = capsys.readouterr()
        return CLIResult(code, out.out, out.err), root

    return run


@pytest.mark.parametrize("flag,name", [*(("--accelerator", a) for a in ACCELERATORS),
                                       ("--strategy", "xla")])
def test_selecting_an_unavailable_accelerator_is_a_usage_error(fit_in_process, flag, name):
    """A one-paragraph ``ptrain: error:`` naming the plugin and its reason; nothing written."""
    kind = flag.lstrip("-")
    reason = {"cuda": expected_cuda_reason(), "mps": expected_mps_reason(),
              "tpu": "torch_xla is not installed", "xla": "torch_xla is not installed",
              "hpu": "habana_frameworks is not installed"}[name]
    if reason is None or (name in ("tpu", "xla") and REAL_XLA) or (name == "hpu" and REAL_HABANA):
        pytest.skip(f"{name} may be able to run here")
    result, root = fit_in_process(flag, name)
    message = assert_usage_error(result, f"{kind} {name!r} can't run on this machine", reason)
    assert "\n" not in message.strip(), message  # one paragraph
    assert not root.exists(), sorted(root.rglob("*"))


@pytest.mark.parametrize("name,reason", [
    ("tpu", "torch_xla is installed but no TPU was found"),
    ("hpu", "habana_frameworks is installed but no Gaudi device was found")])
def test_selecting_tpu_or_hpu_with_the_library_but_no_device(fit_in_process, fake_libs,
                                                            monkeypatch, name, reason):
    """With the stand-in libraries importable, selection finds them, imports nothing, and the
    error says a device is missing."""
    if TPU_PRESENT or HPU_PRESENT:
        pytest.skip("a TPU or Gaudi device is present")
    monkeypatch.syspath_prepend(str(fake_libs))
    result, root = fit_in_process("--accelerator", name)
    assert FAKE_MARK not in result.stdout + result.stderr
    assert_usage_error(result, f"accelerator {name!r} can't run on this machine", reason)
    assert "torch_xla" not in sys.modules and "habana_frameworks" not in sys.modules
    assert not root.exists()


@pytest.mark.parametrize("name", ACCELERATORS)
def test_a_plugin_object_refuses_to_set_up_where_it_can_t_run(tmp_path, name):
    """Given as an object from Python, the plugin skips the selection's availability check; its
    own ``setup_device`` refuses with a PluginError saying why and what to use instead, before
    any step (and without importing torch_xla or habana_frameworks)."""
    from ptrain_cuda import CUDAAccelerator
    from ptrain_habana import HPUAccelerator
    from ptrain_mps import MPSAccelerator
    from ptrain_xla.accelerator import TPUAccelerator

    cls = {"cuda": CUDAAccelerator, "mps": MPSAccelerator, "tpu": TPUAccelerator,
           "hpu": HPUAccelerator}[name]
    reason = cls.check_available()
    if reason is None:
        pytest.skip(f"{name} can run here")
    trainer = ptrain.Trainer(accelerator=cls(), max_epochs=1,
                             default_root_dir=str(tmp_path / "runs"),
                             callbacks=["no:progress-bar", "no:tensorboard"])
    with pytest.raises(ptrain.PluginError) as info:
        trainer.fit(TinyRegressor())
    message = str(info.value)
    assert message.startswith(f"--accelerator {name} can't run here: {reason}"), message
    assert "--accelerator cpu" in message
    assert trainer.global_step == 0
    assert not list(tmp_path.rglob("*.ckpt"))
    assert "torch_xla" not in sys.modules and "habana_frameworks" not in sys.modules


# ---------------------------------------------------------------------------------------------
# --accelerator auto


def test_accelerator_priorities_put_cpu_last():
    """``auto`` takes the available accelerator with the highest priority: the documented order
    is cuda > tpu > hpu > mps > cpu."""
    from ptrain.builtins.cpu import CPUAccelerator
    from ptrain_cuda import CUDAAccelerator
    from ptrain_habana import HPUAccelerator
    from ptrain_mps import MPSAccelerator
    from ptrain_xla.accelerator import TPUAccelerator

    order = [CUDAAccelerator, TPUAccelerator, HPUAccelerator, MPSAccelerator, CPUAccelerator]
    priorities = [cls.priority for cls in order]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == 5, priorities
    assert CPUAccelerator.priority == min(priorities)


def test_auto_falls_back_to_cpu_with_every_plugin_installed(tmp_path):
    if any(r is None for r in (expected_cuda_reason(), expected_mps_reason())) or TPU_PRESENT \
            or HPU_PRESENT:
        pytest.skip("an accelerator other than cpu can run here")
    trainer = ptrain.Trainer(accelerator="auto", max_epochs=1, limit_train_batches=2,
                             limit_val_batches=1, default_root_dir=str(tmp_path / "runs"),
                             callbacks=["no:progress-bar", "no:tensorboard"])
    assert type(trainer.plugins["cpu"]).__name__ == "CPUAccelerator"
    assert not set(ACCELERATORS) & set(trainer.plugins), sorted(trainer.plugins)
    trainer.fit(TinyRegressor())
    assert trainer.device == torch.device("cpu")
    assert trainer.global_step == 2
    assert all(p.device.type == "cpu" for p in trainer.module.parameters())


def test_auto_on_the_command_line_trains_without_importing_device_libraries(runs):
    """``ptrain fit --accelerator auto`` with the stand-in libraries on the path: the checks of
    tpu and hpu (which find the packages) import nothing, and the run trains on the CPU."""
    result = runs["fake-auto"]
    assert_ok(result)
    assert FAKE_MARK not in result.stdout + result.stderr
    checkpoint = torch.load(runs.dirs["fake-auto"] / "version_0" / "checkpoints" / "last.ckpt",
                            map_location="cpu", weights_only=False)
    assert checkpoint["loop"]["global_step"] == 3
    assert checkpoint["config"]["trainer"]["accelerator"] == "auto"
    assert all(t.device.type == "cpu" for t in checkpoint["model"].values())


# ---------------------------------------------------------------------------------------------
# CUDAAccelerator.device_index


def test_cuda_device_index_picks_the_local_rank_s_gpu():
    from ptrain_cuda import CUDAAccelerator

    assert CUDAAccelerator.device_index([2, 5, 7], 0) == 2
    assert CUDAAccelerator.device_index([2, 5, 7], 1) == 5
    assert CUDAAccelerator.device_index([3], 0) == 3
    # a count, or auto: the GPU numbered by the local rank
    assert CUDAAccelerator.device_index(4, 0) == 0
    assert CUDAAccelerator.device_index(4, 3) == 3
    assert CUDAAccelerator.device_index("auto", 1) == 1


def test_cuda_device_index_list_shorter_than_the_local_rank_is_a_config_error():
    from ptrain_cuda import CUDAAccelerator

    with pytest.raises(ptrain.ConfigError) as info:
        CUDAAccelerator.device_index([0, 1], 2)
    message = str(info.value)
    assert "--devices 0,1" in message and "2 GPUs" in message and "local process 2" in message
    with pytest.raises(ptrain.ConfigError):
        CUDAAccelerator.device_index([0], 1)


# ---------------------------------------------------------------------------------------------
# Options


def help_section(text: str, title: str) -> str:
    """The part of ``--help`` output from the group titled ``title`` to the next group."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i][0].isspace()), len(lines))
    return "\n".join(lines[start:end])


def test_fit_help_groups_each_plugin_s_options(runs):
    """Every installed plugin's options are shown under its name (stand-in libraries on the
    path: declaring options imports nothing of them either)."""
    result = runs["fake-help"]
    assert_ok(result)
    out = result.stdout
    assert FAKE_MARK not in out + result.stderr and "failed to import" not in out
    cuda = help_section(out, "cuda (accelerator, ptrain-cuda)")
    assert "active with --accelerator cuda" in cuda
    from ptrain.loading import declare_options
    from ptrain_cuda import CUDAAccelerator
    from ptrain_habana import HPUAccelerator
    from ptrain_xla.strategy import XLAStrategy

    for flag in (o.flag for o in declare_options(CUDAAccelerator, "cuda").options.values()):
        assert flag in cuda, flag
    assert "--no-cuda-pin-memory" in cuda and "--no-cuda-cudnn-benchmark" in cuda
    for word in ("highest", "high", "medium"):
        assert word in help_section(cuda, "  --cuda-float32-matmul-precision")
    hpu = help_section(out, "hpu (accelerator, ptrain-habana)")
    assert "active with --accelerator hpu" in hpu and "--hpu-lazy-mode" in hpu
    xla = help_section(out, "xla (strategy, ptrain-xla)")
    for flag in (o.flag for o in declare_options(XLAStrategy, "xla").options.values()):
        assert flag in xla, flag
    assert declare_options(HPUAccelerator, "hpu").options.keys() == {"lazy_mode"}
    # mps and tpu declare no options: no group for them
    assert "mps (accelerator" not in out and "tpu (accelerator" not in out
    # cuda's flags are described in its group only (the usage line at the top lists them all)
    described = out[out.index("\noptions:"):]
    assert described.count("--cuda-memory-snapshot-entries") == 1


def test_a_cuda_flag_without_the_cuda_accelerator_is_a_usage_error(fit_in_process):
    result, root = fit_in_process("--accelerator", "cpu", "--cuda-float32-matmul-precision", "high")
    assert_usage_error(result, "--cuda-float32-matmul-precision", "accelerator plugin 'cuda'",
                       "--accelerator cuda")
    assert not root.exists()


def test_a_bogus_matmul_precision_is_refused(fit_in_process):
    """On the command line the availability check comes first (so here the error is that cuda
    can't run); the value itself is checked by the option's converter when the options are
    resolved, which is what a machine with a GPU does next."""
    from ptrain.loading import declare_options
    from ptrain_cuda import CUDAAccelerator

    result, root = fit_in_process("--accelerator", "cuda",
                                  "--cuda-float32-matmul-precision", "bogus")
    reason = expected_cuda_reason()
    if reason is not None:
        assert_usage_error(result, "accelerator 'cuda' can't run on this machine", reason)
    else:
        assert_usage_error(result, "--cuda-float32-matmul-precision", "highest", "medium")
    assert not root.exists()

    options = declare_options(CUDAAccelerator, "cuda")
    with pytest.raises(ptrain.ConfigError) as info:
        options.resolve({"float32_matmul_precision": "bogus"}, "config")
    message = str(info.value)
    assert "--cuda-float32-matmul-precision" in message and "[plugins.cuda]" in message
    assert "'bogus'" in message
    for choice in ("highest", "high", "medium"):
        assert choice in message
        assert options.resolve({"float32_matmul_precision": choice},
                               "config")["float32_matmul_precision"] == choice


def test_cuda_options_resolve_to_the_constructor_s_arguments():
    """Each declared option is an __init__ argument with the same default, and values from text
    (flags) are converted."""
    from ptrain.loading import declare_options, instantiate
    from ptrain_cuda import CUDAAccelerator

    options = declare_options(CUDAAccelerator, "cuda")
    params = {name: p.default for name, p in
              inspect.signature(CUDAAccelerator.__init__).parameters.items() if name != "self"}
    defaults = options.resolve({}, "default")
    assert defaults == params
    resolved = options.resolve({"cudnn_benchmark": "true", "pin_memory": "off",
                                "memory_snapshot": "snap.pickle",
                                "memory_snapshot_entries": "500"}, "flags")
    plugin = instantiate(CUDAAccelerator, "cuda", resolved)
    assert (plugin.cudnn_benchmark, plugin.pin_memory) == (True, False)
    assert (plugin.memory_snapshot, plugin.memory_snapshot_entries) == ("snap.pickle", 500)
    with pytest.raises(ptrain.ConfigError):
        options.resolve({"memory_snapshot_entries": "many"}, "flags")


def test_hpu_lazy_mode_option():
    from ptrain.loading import declare_options, instantiate
    from ptrain_habana import HPUAccelerator

    options = declare_options(HPUAccelerator, "hpu")
    assert options.resolve({}, "default") == {"lazy_mode": True}
    assert instantiate(HPUAccelerator, "hpu",
                       options.resolve({"lazy_mode": "off"}, "flags")).lazy_mode is False


# ---------------------------------------------------------------------------------------------
# tpu / hpu modules without their libraries


def test_tpu_and_hpu_modules_import_without_their_libraries(fake_libs, monkeypatch):
    """The plugin modules import with neither library; the problem functions name the missing
    library, and with the stand-ins on the path they find it without importing it."""
    if REAL_XLA or REAL_HABANA:
        pytest.skip("torch_xla or habana_frameworks is really installed here")
    import ptrain_habana
    import ptrain_xla.accelerator
    import ptrain_xla.strategy
    from ptrain.loading import check_available

    assert "torch_xla" not in sys.modules and "habana_frameworks" not in sys.modules
    tpu_reason = ptrain_xla.accelerator.tpu_problem()
    hpu_reason = ptrain_habana.hpu_problem()
    assert tpu_reason.startswith("torch_xla is not installed: pip install 'torch_xla[tpu]'")
    assert hpu_reason.startswith("habana_frameworks is not installed: install Intel Gaudi")
    assert check_available(ptrain_xla.accelerator.TPUAccelerator, "tpu") == tpu_reason
    assert check_available(ptrain_xla.strategy.XLAStrategy, "xla") == tpu_reason
    assert check_available(ptrain_habana.HPUAccelerator, "hpu") == hpu_reason

    if TPU_PRESENT or HPU_PRESENT:
        return
    monkeypatch.syspath_prepend(str(fake_libs))
    assert ptrain_xla.accelerator.tpu_problem().startswith(
        "torch_xla is installed but no TPU was found")
    assert ptrain_habana.hpu_problem().startswith(
        "habana_frameworks is installed but no Gaudi device was found")
    assert "torch_xla" not in sys.modules and "habana_frameworks" not in sys.modules
