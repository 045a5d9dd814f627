"""What every multi-process strategy shares: processes, ranks, the process group, sharded data.

ptrain runs on torch's own distributed engine; nothing here is a process pool of its own:

- **Where the processes come from** (the strategy's ``launcher`` option; ``auto`` tries them in
  this order). :func:`detect_environment` finds ranks set by a launcher that already ran
  (``torchrun`` / torch's elastic agent, SLURM's ``srun``, or an earlier stage of this script);
  then the stage runs in the process it was called in. Otherwise, when the program can be run
  again (a script, ``python -m``, the ``ptrain`` command), the ``script`` launcher
  (:mod:`ptrain.script_launch`) starts it again as the other ranks and this process becomes
  rank 0, for the rest of the script. Where it can't (an interactive session, a notebook, a
  stage called from a test runner, ``--num-nodes`` > 1), the ``spawn`` launcher,
  :func:`launch_workers`, runs this one stage in new worker processes with torch's elastic
  launcher (``torch.distributed.launcher.api.elastic_launch``, the engine behind ``torchrun``),
  with c10d rendezvous, across ``num_nodes`` machines when asked; the module and plugins are
  pickled to the workers and the trained weights come back.
- **A failing rank ends the job.** The error of the rank that failed first is raised in the
  launching process (a :class:`ptrain.PtrainError` as itself, anything else as
  :class:`WorkerError` carrying the rank's traceback) and the other ranks are stopped.
  A rank that stops responding (stopped, frozen, dead under NCCL) ends the job within
  ``stall_timeout`` seconds (:mod:`ptrain.rank_watch`); collectives have a timeout, so no rank
  waits for ever.
- **Start-up ends within ``timeout`` too.** Where the processes meet (``rdzv_endpoint``, or
  ``MASTER_ADDR``/``MASTER_PORT``) is checked before anything waits on it
  (:mod:`ptrain.rendezvous`): an address that doesn't resolve, a port another program holds,
  an endpoint that never answers, or machines that never join end in a :class:`ConfigError`
  naming the endpoint, not a hang or torch's traceback.
- :class:`ProcessGroupStrategy`: hook implementations that set the ranks, create the process
  group, give each rank its shard of the data (``DistributedSampler``, ``set_epoch`` each
  epoch), reduce metrics across ranks and put barriers after checkpoint writes. The ``ddp``,
  ``fsdp`` and ``zero*`` strategies subclass it and add how they wrap the model and optimizer.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import multiprocessing
import os
import pickle
import re
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch.utils.data import (DataLoader, DistributedSampler, IterableDataset, RandomSampler,
                              SequentialSampler)

from ptrain import machines, rank_errors, rank_watch, rendezvous, restart_store, script_launch
from ptrain.data import rebuild_dataloader
from ptrain.errors import CheckpointWriteError, ConfigError, Interrupted, PtrainError
from ptrain.hookspecs import hookimpl
from ptrain.options import to_bool
from ptrain.seeding import last_seed, seed_replica_worker

if TYPE_CHECKING:
    from ptrain.options import OptionGroup
    from ptrain.trainer import Trainer

_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN}


# -- environment -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """The ranks of this process, as a launcher that already ran set them."""

    global_rank: int
    local_rank: int
    world_size: int
    source: str  # "torchelastic", "slurm", "script" (ptrain's script launcher) or "environment"


def detect_environment() -> Environment | None:
    """The ranks set by a launcher that started this process, or ``None`` when none did.

    torchrun (and the workers :func:`launch_workers` starts) set ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. Under SLURM, a job step started with
    ``srun`` (one task per device) has ``SLURM_PROCID``; its rendezvous is the job's first node,
    on a port derived from the job id, and the torch variables are set from SLURM's for
    ``init_process_group``. An interactive allocation (``salloc`` then ``python``) is not a
    launcher: ``SLURM_NTASKS`` is 1 there, or the job is named ``bash``/``interactive``.
    """
    env = os.environ
    if all(k in env for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        source = ("torchelastic" if "TORCHELASTIC_RUN_ID" in env else
                  "script" if script_launch.LAUNCHER_PID in env else "environment")
        return _checked_environment(env, source)
    if ("SLURM_PROCID" in env and _slurm_tasks(env) > 1
            and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")):
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "127.0.0.1")
        env.setdefault("MASTER_ADDR", first_host(nodelist))
        env.setdefault("MASTER_PORT", str(15000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
        env["RANK"], env["LOCAL_RANK"] = env["SLURM_PROCID"], env.get("SLURM_LOCALID", "0")
        env["WORLD_SIZE"] = env["SLURM_NTASKS"]
        return _checked_environment(env, "slurm")
    return None


def _slurm_tasks(env) -> int:
    text = env.get("SLURM_NTASKS", "1")
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"the environment variable SLURM_NTASKS={text!r} is not a whole number; SLURM sets "
            f"it to the job step's number of tasks. Unset it (and SLURM_PROCID) to run outside "
            f"a SLURM job step.") from None


def _checked_environment(env, source: str) -> Environment:
    """The torchrun-style variables as an :class:`Environment`, refused in one paragraph when
    one is not a number or they contradict each other (they would fail deep in torch, or wait
    for a rank that can't exist)."""
    by = "the environment" if source == "environment" else source
    numbers = {}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"):
        text = env[name]
        try:
            numbers[name] = int(text)
        except ValueError:
            numbers[name] = None
        if numbers[name] is None or numbers[name] < 0:
            raise ConfigError(
                f"the environment variable {name}={text!r} (set by {by}) is not a whole "
                f"number >= 0. RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are "
                f"set by the launcher (torchrun, srun) for each process; unset them to run "
                f"without one, or give {name} a valid value.")
    rank, world, port = numbers["RANK"], numbers["WORLD_SIZE"], numbers["MASTER_PORT"]
    problem = ("WORLD_SIZE=0: a job has at least one process" if world == 0 else
               f"RANK={rank} is not below WORLD_SIZE={world}" if rank >= world else
               f"MASTER_PORT={port} is not a port (1 to 65535)" if not 0 < port < 65536 else
               None)
    if problem is not None:
        raise ConfigError(
            f"the launcher's environment (set by {by}) does not describe a job: {problem}. "
            f"Ranks are numbered from 0 to WORLD_SIZE - 1; unset RANK, LOCAL_RANK, WORLD_SIZE, "
            f"MASTER_ADDR and MASTER_PORT to run without a launcher, or start the job with "
            f"torchrun, which sets them.")
    return Environment(rank, numbers["LOCAL_RANK"], world, source)


_HOSTLIST = re.compile(r"^([^,\[]+)(?:\[([^\]]+)\])?")


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: ``"gpu[03-05,09],cpu1"`` -> ``"gpu03"``."""
    match = _HOSTLIST.match(nodelist.strip())
    if match is None:
        raise ConfigError(f"can't read the SLURM node list {nodelist!r}; set MASTER_ADDR.")
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]


# -- launching ---------------------------------------------------------------------------------


def launch_workers(function: Callable[[], Any], *, nprocs: int, num_nodes: int = 1,
                   rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                   timeout: float | None = None, hint: str = "rdzv_endpoint",
                   stall_timeout: float = 0.0) -> Any:
    """Run ``function`` (picklable) in ``nprocs`` new processes on this machine, joined by c10d
    rendezvous with those of the other ``num_nodes - 1`` machines, and return what the lowest
    global rank on this machine returned.

    ``rdzv_endpoint`` (``host:port``) is where the machines meet; one machine needs none (a free
    port on localhost is used). Raises the first failing worker's error (see module docstring).

    ``timeout`` (seconds) bounds the rendezvous: an endpoint that is not this machine's free port
    is checked first (:func:`ptrain.rendezvous.probe_store`), and the machines must all join
    within it; otherwise a :class:`ConfigError` names the endpoint (``hint``: the option that
    gave it). ``None``: torch's defaults (10 minutes to join). Each of the launcher's own
    store operations waits at most ``stall_timeout`` (when set, and at most a minute, torch's
    default): a machine cut off from the rendezvous's host ends its launcher that much later
    than its workers, not many minutes.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if num_nodes > 1 and not rdzv_endpoint:
        raise ConfigError(f"--num-nodes {num_nodes} needs a rendezvous endpoint that every "
                          f"machine reaches: set the strategy's rdzv_endpoint option to HOST:PORT "
                          f"of one of them (the same on all), and the same rdzv_id.")
    rdzv_configs: dict[str, Any] = {}
    local_addr, hosted, host, port = None, None, "", 0
    if timeout is not None:
        rdzv_configs.update(join_timeout=max(1, math.ceil(timeout)))
    store_s = max(5, math.ceil(min(60.0, timeout or 60.0, stall_timeout or 60.0)))
    rdzv_configs.update(read_timeout=store_s, close_timeout=store_s, heartbeat_timeout=store_s)
    if rdzv_endpoint:
        host, port = rendezvous.parse_endpoint(rdzv_endpoint, hint)
        addresses = rendezvous.resolve(host, hint)
        # the first machine on the endpoint's own host hosts the store on its free port; all
        # others connect to it, which torch would do without a bound
        hosting = rendezvous.is_this_machine(addresses) and rendezvous.port_is_free(port)
        if num_nodes > 1:
            # across machines ptrain hosts it (see ptrain.machines); torch's agents are clients
            hosted = machines.RendezvousHost.start(host, port, timeout or 1800.0) \
                if hosting else None
            rdzv_configs["is_host"] = False
            # where the other machines reach this one (the first machine's is their
            # MASTER_ADDR): the address that faces the endpoint, not what the host name
            # resolves to (often 127.0.0.1)
            local_addr = rendezvous.route_address(host)
        if not hosting or (num_nodes > 1 and hosted is None):
            rendezvous.probe_store(host, port, 1800.0 if timeout is None else timeout, hint)
    config = LaunchConfig(
        min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=nprocs,
        run_id=rdzv_id or "ptrain", rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0", max_restarts=0, monitor_interval=0.1,
        start_method="spawn", rdzv_configs=rdzv_configs, local_addr=local_addr,
    )
    # Plain pickle bytes: handed over as objects, the module's tensors would be moved into
    # shared memory (torch.multiprocessing's pickling), and every rank would update one copy.
    # They go to the workers in a file, not through the pipe spawn starts a worker with: the
    # launcher writes that pipe whole while holding its read end, so a worker that dies before
    # reading it all (a program without its `if __name__ == "__main__":` guard, an import that
    # fails) would leave the launcher blocked for good once it holds more than the pipe's 64 KiB.
    payload = pickle.dumps(function)
    # failures are reported below, once, with the cause; torch's own lines would come first
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic",
                                              "torch.multiprocessing.spawn")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    # elastic_launch sets this in the launching process and leaves it: a stage call must not
    # change the caller's environment (a test suite that checks for leaks sees it)
    signals_variable = os.environ.get(_ELASTIC_SIGNALS)
    returned = threading.Event()
    try:
        with tempfile.TemporaryDirectory(prefix="ptrain-workers-") as error_dir:
            payload_file = Path(error_dir) / "function.pkl"
            payload_file.write_bytes(payload)
            del payload
            if num_nodes > 1:
                threading.Thread(target=machines.end_if_agent_blocked, name="ptrain-agent-watch",
                                 args=(error_dir, returned, 3 * store_s + 10.0),
                                 daemon=True).start()
            try:
                results = elastic_launch(config, _run_worker)(
                    str(payload_file), error_dir, multiprocessing.get_start_method())
            except ChildFailedError as exc:
                raise _first_error(exc, Path(error_dir)) from None
            except RendezvousError as exc:
                raise _rendezvous_error(exc, config, hint) from None
            finally:
                returned.set()
        # the job succeeded: the other machines' agents close the rendezvous on the store
        if hosted is not None:
            hosted.close_after_others(num_nodes - 1, within=store_s)
        elif num_nodes > 1:
            machines.say_returned(host, port, within=store_s)
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
        if signals_variable is None:
            os.environ.pop(_ELASTIC_SIGNALS, None)
        else:
            os.environ[_ELASTIC_SIGNALS] = signals_variable
    return results[min(results)] if results else None


_ELASTIC_SIGNALS = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def _run_worker(payload_file: str, error_dir: str, start_method: str) -> Any:
    """A worker's entry point: unpickle the function from ``payload_file`` (its pickle bytes)
    and run it. An error is written to a file for the launching process (with its traceback)
    and the worker exits quietly: 2 for a usage error, else 1.

    ``start_method`` is the launching process's multiprocessing start method, which the worker
    takes as its own: started by spawn, it would otherwise start its DataLoader workers by
    spawn too, each importing the program again for every pass (5x slower steps seen on a
    notebook with 4 loader workers), where the program run without ptrain forks them."""
    multiprocessing.set_start_method(start_method, force=True)
    rank_watch.record_stalls_in(error_dir)
    try:
        result = pickle.loads(Path(payload_file).read_bytes())()
    except BaseException as exc:
        rank_watch.stop("failed", exc)
        rank_errors.write_record(error_dir, exc, int(os.environ.get("RANK", "0")))
        raise SystemExit(2 if isinstance(exc, PtrainError) else 1) from None
    rank_watch.stop("exited")
    return result


def _rendezvous_error(exc: BaseException, config: Any, hint: str) -> ConfigError:
    """The sentence for a rendezvous of the spawn launcher that failed (torch's error)."""
    from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

    timeout = config.rdzv_configs.get("join_timeout", 600)
    if isinstance(exc, RendezvousTimeoutError):
        here = socket.gethostname() + (f", {config.local_addr}" if config.local_addr else "")
        others = ("the other one never came" if config.max_nodes == 2 else
                  f"not all of the other {config.max_nodes - 1} came")
        return ConfigError(
            f"not all {config.max_nodes} machines joined the rendezvous at "
            f"{config.rdzv_endpoint} ({hint}, id {config.run_id!r}) within {timeout} s: this "
            f"one ({here}) did, {others}. Start every machine with the same endpoint, id and "
            f"--num-nodes, check that they reach the endpoint, or raise the timeout.")
    return ConfigError(
        f"the rendezvous at {config.rdzv_endpoint} ({hint}, id {config.run_id!r}) failed: "
        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__} "
        f"({type(exc).__name__}). Check the endpoint is the same on every machine and reachable "
        f"from all, or give a free port on one of them.")


def _first_error(failed: Any, error_dir: Path) -> BaseException:
    records = rank_errors.read_records(error_dir)
    if records:
        return rank_errors.error_of(records[0])
    rank, failure = failed.get_first_failure()
    return rank_errors.silent_failure(rank, failure.exitcode, failure.signal_name())


# -- the strategy base -------------------------------------------------------------------------


def _launcher_choice(value: Any) -> str:
    value = str(value)
    if value not in LAUNCHERS:
        raise ValueError(f"expected {', '.join(LAUNCHERS)}, got {value!r}")
    return value


def _train_shuffle_choice(value: Any) -> str:
    value = str(value)
    if value not in ("loader", "always"):
        raise ValueError(f"expected loader or always, got {value!r}")
    return value


def _seconds_or_off(value: Any) -> float:
    seconds = float(value)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"expected a number of seconds >= 0 (0: off), got {value!r}")
    return seconds


#: The ``launcher`` option's choices (see the module docstring).
LAUNCHERS = ("auto", "script", "spawn")


def _backend_choice(value: Any) -> str:
    value = str(value)
    if value not in ("auto", "gloo", "nccl", "mpi", "xccl", "hccl"):
        raise ValueError(f"expected auto, gloo, nccl, mpi, xccl or hccl, got {value!r}")
    return value


class ProcessGroupStrategy:
    """Base class of the strategies that train in several processes joined by a process group.

    Subclasses add ``wrap_model`` (and ``wrap_optimizer``, checkpoint hooks) for how they
    parallelise; the launch, ranks, process group, data sharding, metric reduction and barriers
    come from here. A subclass with its own options declares them in its ``add_options`` and
    calls :meth:`add_process_group_options` there.
    """

    #: Why this strategy can't write a whole checkpoint on the first process of every machine
    #: (``save_on_each_node``); ``None`` where it can. Sharded checkpoints can't: each process
    #: writes its part, and each reads every part when it resumes.
    no_checkpoint_on_each_node: str | None = (
        "its checkpoints are sharded: each process writes its part, and every process reads "
        "all the parts when it resumes")

    def __init__(self, timeout: float = 1800.0, process_group_backend: str = "auto",
                 rdzv_endpoint: str | None = None, rdzv_id: str = "ptrain",
                 distributed_sampler: bool = True, train_shuffle: str = "loader",
                 launcher: str = "auto", stall_timeout: float = 300.0):
        self.timeout = timeout
        self.stall_timeout = stall_timeout
        self.launcher = launcher
        self.process_group_backend = process_group_backend
        self.rdzv_endpoint, self.rdzv_id = rdzv_endpoint, rdzv_id
        self.distributed_sampler = distributed_sampler
        self.train_shuffle = train_shuffle
        self.environment: Environment | None = None
        self._key_prefix = ""  # of this try's keys in a store that outlives it (restart_store)

    @staticmethod
    def add_process_group_options(options: OptionGroup, launcher: bool = True) -> None:
        """The options of this class; ``launcher=False`` for a subclass whose ``launch`` hook
        starts its processes its own way (the ``launcher`` option would do nothing)."""
        options.add("timeout", float, default=1800.0,
                    help="seconds any collective may wait for the other ranks before the job "
                         "fails (no rank hangs for ever)")
        options.add("stall_timeout", _seconds_or_off, default=300.0,
                    help="seconds a rank may go without a heartbeat (stopped, frozen, or dead "
                         "under NCCL) before the job ends, naming it and what it was doing; "
                         "0: no heartbeat (the collective timeout still applies)")
        options.add("process_group_backend", _backend_choice, default="auto",
                    help="torch.distributed backend; auto: the accelerator's (nccl on CUDA, hccl on "
                         "Gaudi, gloo on CPU)")
        options.add("rdzv_endpoint", str,
                    help="HOST:PORT where the processes meet: for --num-nodes > 1 the same on "
                         "every machine; on one machine an address of this one (default: a "
                         "free port). Start-up ends within --<strategy>-timeout if they can't")
        options.add("rdzv_id", str, default="ptrain",
                    help="the job's id, the same on every machine of the job")
        if launcher:
            options.add("launcher", _launcher_choice, default="auto",
                        help="how the processes start when no launcher (torchrun, srun) "
                             "started them: script: this program is run again as the other "
                             "ranks, which stay up for the rest of it; spawn: each stage runs "
                             "in new worker processes (the module is pickled to them); auto: "
                             "script where there is a program to run again and one machine, "
                             "else spawn")
        options.add("distributed_sampler", to_bool, default=True,
                    help="give each rank its shard of the data with a DistributedSampler; off: "
                         "the dataloaders are used as they are (yours to shard)")
        options.add("train_shuffle", _train_shuffle_choice, default="loader",
                    help="whether that sampler shuffles the training data: loader: as the "
                         "training DataLoader does (shuffle=True or not); always: whatever the "
                         "DataLoader says, as Lightning's inserted sampler does")

    # -- processes ---------------------------------------------------------------------------

    def processes_per_node(self, trainer: Trainer) -> int:
        """One process per device: ``--devices`` as a count, the length of a list of indices, or
        for ``auto`` what the accelerator's ``auto_device_count()`` says (1 without one). A count
        above what the accelerator sees is a usage error before any process starts."""
        devices = trainer.devices
        if isinstance(devices, list):
            return len(devices)
        accelerator = trainer.plugins.get(trainer.options["accelerator"])
        count = getattr(accelerator, "auto_device_count", None)
        visible = count() if callable(count) else None
        if devices == "auto":
            return visible or 1
        if visible is not None and devices > visible:
            raise ConfigError(f"--devices {devices} asks for more devices than the "
                              f"{trainer.options['accelerator']} accelerator sees here "
                              f"({visible}); give at most {visible}, or --devices auto.")
        return devices

    @hookimpl
    def launch(self, trainer: Trainer, function: Callable[[], Any]) -> Any:
        nprocs = self.processes_per_node(trainer)
        expected = nprocs * trainer.num_nodes
        self.environment = detect_environment()
        if self.environment is None:
            command = self._relaunch_command(trainer)
            hint = f"--{trainer.options['strategy']}-rdzv-endpoint"
            if command is None:
                return launch_workers(function, nprocs=nprocs, num_nodes=trainer.num_nodes,
                                      rdzv_endpoint=self.rdzv_endpoint, rdzv_id=self.rdzv_id,
                                      timeout=self.timeout, hint=hint,
                                      stall_timeout=self.stall_timeout)
            script_launch.start_copies(command, nprocs, endpoint=self._local_endpoint(hint))
            self.environment = detect_environment()
        if self.environment.source == "script" and self.environment.world_size != expected:
            raise ConfigError(
                f"an earlier stage of this script started {self.environment.world_size} "
                f"processes, which run the rest of it, but --devices {trainer.devices} "
                f"--num-nodes {trainer.num_nodes} asks for {expected}; give every trainer of "
                f"one script the same devices, or pass launcher='spawn' to the strategy.")
        if self.environment.world_size != expected:
            raise ConfigError(
                f"this process was started by {self.environment.source} as one of "
                f"{self.environment.world_size} processes, but --devices {trainer.devices} "
                f"--num-nodes {trainer.num_nodes} asks for {expected}; make them agree (e.g. "
                f"torchrun --nproc-per-node {trainer.devices} --nnodes {trainer.num_nodes})."
            )
        return None  # the processes exist: run here

    def _local_endpoint(self, hint: str) -> tuple[str, int] | None:
        """Where the script launcher's processes meet: the ``rdzv_endpoint`` given (a free port
        of this machine, checked before any process starts), else ``None`` (a free port)."""
        if not self.rdzv_endpoint:
            return None
        host, port = rendezvous.parse_endpoint(self.rdzv_endpoint, hint)
        if not rendezvous.is_this_machine(rendezvous.resolve(host, hint)):
            raise ConfigError(
                f"{hint} {self.rdzv_endpoint} is not an address of this machine, but the "
                f"processes of this one-machine job start here and rank 0 hosts their "
                f"rendezvous; give an address of this machine (e.g. 127.0.0.1:{port}), or leave "
                f"the option out for a free port.")
        if port and not rendezvous.port_is_free(port):
            raise rendezvous.busy_port_error(host, port, hint)
        return host, port

    def _relaunch_command(self, trainer: Trainer) -> list[str] | None:
        """The command that starts this program again as the other ranks, or ``None`` for the
        spawn launcher (see ``launcher``)."""
        if self.launcher == "spawn":
            return None
        command = script_launch.relaunch_command() if trainer.num_nodes == 1 else None
        if command is None and self.launcher == "script":
            why = (f"--num-nodes {trainer.num_nodes} (start each machine's processes with "
                   f"torchrun or srun)" if trainer.num_nodes != 1 else
                   "there is no program to run again here (an interactive session, python -c, "
                   "or a stage called from a test runner)")
            raise ConfigError(f"launcher 'script' can't start the other ranks: {why}; use "
                              f"launcher 'spawn' or 'auto'.")
        return command

    @hookimpl
    def report_error(self, trainer: Trainer, exception: BaseException) -> BaseException | None:
        # the rank watch ended the job, or a collective timed out: the watch's message says
        # why, and which rank, not the broken collective's
        stalled = rank_watch.stall_error() or rank_watch.timeout_error(
            exception, self.timeout, f"--{trainer.options['strategy']}-timeout") \
            or rank_watch.lost_peer_error(exception)
        reported = stalled
        if script_launch.is_started_copy():
            script_launch.record_error(stalled or exception)
        elif script_launch.is_launcher():  # names a dead rank with what its heartbeat said
            reported = script_launch.first_error(stalled or exception)
        if not isinstance(exception, Interrupted):  # after a signal every rank ends alike
            rank_watch.stop("failed", reported or exception)
        return reported

    @hookimpl(wrapper=True)
    def setup_device(self, trainer: Trainer):
        environment = self.environment or detect_environment()
        if environment is None:
            raise ConfigError(f"{type(self).__name__} runs in processes started by its launch "
                              f"hook or by torchrun; none set RANK/WORLD_SIZE here.")
        trainer.global_rank = environment.global_rank
        trainer.local_rank = environment.local_rank
        trainer.world_size = environment.world_size
        if trainer.save_on_each_node and trainer.num_nodes > 1 \
                and self.no_checkpoint_on_each_node is not None:
            raise ConfigError(
                f"save_on_each_node: {trainer.options['strategy']} can't write a whole "
                f"checkpoint on each machine: {self.no_checkpoint_on_each_node}. Put the run "
                f"root on a filesystem every machine shares and leave save_on_each_node out, "
                f"or use ddp.")
        if environment.source == "script" and script_launch.is_started_copy() \
                and not dist.is_initialized():
            script_launch.watch_launcher()
            script_launch.install_quiet_exit()
        device = yield
        if not dist.is_initialized():
            backend = self.process_group_backend
            if backend == "auto":  # the accelerator knows its collective library
                accelerator = trainer.plugins.get(trainer.options["accelerator"])
                backend = getattr(accelerator, "process_group_backend", "gloo")
            self._init_process_group(backend, environment, device, trainer)
            atexit.register(_destroy_process_group)
        if self.stall_timeout > 0 and trainer.world_size > 1:
            rank_watch.start(rank=trainer.global_rank, world_size=trainer.world_size,
                             stall_timeout=self.stall_timeout, host=os.environ["MASTER_ADDR"],
                             port=int(os.environ["MASTER_PORT"]),
                             describe=lambda: _doing(trainer),
                             hint=f"--{trainer.options['strategy']}-stall-timeout",
                             key_prefix=self._key_prefix)
        # every rank writes into the run folder rank 0 chose (under torchrun each chose its own)
        chosen = [str(trainer.run_dir) if trainer.run_dir is not None else None]
        dist.broadcast_object_list(chosen, src=0)
        trainer.adopt_run_dir(Path(chosen[0]) if chosen[0] is not None else None)
        _check_one_checkpoint(trainer)
        return device

    def _init_process_group(self, backend: str, environment: Environment,
                            device: torch.device, trainer: Trainer) -> None:
        """``init_process_group`` at ``MASTER_ADDR:MASTER_PORT``, bounded by ``timeout``: an
        address that doesn't resolve, a port another program holds, a store that never answers
        or ranks that never meet end in a :class:`ConfigError` naming the endpoint. gloo gets
        the interface that faces ``MASTER_ADDR`` unless ``GLOO_SOCKET_IFNAME`` says one
        (:func:`ptrain.rendezvous.gloo_interface`)."""
        host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
        set_by = f"set by {_SET_BY.get(environment.source, 'the environment')}"
        hint = f"MASTER_ADDR:MASTER_PORT, {set_by}"
        if environment.source != "script":  # ptrain's script launcher chose them itself
            rendezvous.resolve(host, f"MASTER_ADDR, {set_by}")
        if "gloo" in backend:
            interface = rendezvous.gloo_interface(host, trainer.num_nodes > 1)
            if interface is not None:
                os.environ["GLOO_SOCKET_IFNAME"] = interface
            # rank 0 hosts the store (torchrun's agent hosts it before the ranks start); the
            # others would wait on a silent one for ever
            if environment.global_rank != 0 and environment.source != "torchelastic" \
                    and port.isdigit():
                rendezvous.probe_store(host, int(port), self.timeout, hint)
        meeting: dict[str, Any] = {}
        try:
            if environment.source == "torchelastic" and restart_store.outlives_tries():
                client = dist.TCPStore(host, int(port), is_master=False,
                                       timeout=timedelta(seconds=self.timeout))
                self._key_prefix = restart_store.try_prefix(
                    client, environment.global_rank, environment.world_size, self.timeout)
                meeting = dict(store=dist.PrefixStore(self._key_prefix, client),
                               rank=environment.global_rank, world_size=environment.world_size)
            dist.init_process_group(backend, timeout=timedelta(seconds=self.timeout),
                                    device_id=device if device.type == "cuda" else None,
                                    **meeting)
        except (RuntimeError, TimeoutError) as exc:  # torch's DistError family
            translated = rendezvous.translate(exc, host, int(port) if port.isdigit() else 0,
                                              self.timeout, hint)
            if translated is None:
                raise
            raise translated from None

    # -- data ----------------------------------------------------------------------------------

    def data_parallel(self, trainer: Trainer) -> tuple[int, int, Any]:
        """This process's place among the model's replicas, which read different data:
        ``(rank, size, group)``. The sampler gives each ``rank`` its shard of ``size``; metrics
        are averaged over ``group`` (``None``: the whole job). Here every process is a replica.
        A strategy that splits one replica of the model over several processes (tensor
        parallel) overrides it: those processes must read the same batches."""
        return trainer.global_rank, trainer.world_size, None

    def metric_replicas(self, trainer: Trainer) -> tuple[int, Any]:
        """The processes whose logged metrics are averaged together: ``(count, group)``
        (``None``: the whole job). By default the replicas of :meth:`data_parallel`; a
        strategy whose processes of one replica each see a part of every batch (context
        parallel: a part of each sequence) counts those parts too."""
        _, replicas, group = self.data_parallel(trainer)
        return replicas, group

    @hookimpl(wrapper=True)
    def prepare_dataloader(self, trainer: Trainer, stage: str):
        loader = yield
        if not isinstance(loader, DataLoader):
            return loader
        rank, replicas, _ = self.data_parallel(trainer)
        if loader.num_workers > 0 and loader.worker_init_fn is None:
            # each replica's workers draw their own random numbers (augmentations)
            loader = rebuild_dataloader(
                loader, worker_init_fn=functools.partial(seed_replica_worker, rank))
        if not self.distributed_sampler:
            return loader
        sampler = loader.sampler
        if isinstance(sampler, DistributedSampler):
            return loader  # the user sharded it already
        if type(sampler) not in (RandomSampler, SequentialSampler):
            if isinstance(loader.dataset, IterableDataset):  # no sampler to replace
                raise ConfigError(
                    f"the {stage} dataloader reads an IterableDataset, which a sampler can't "
                    f"shard; shard it yourself (by torch.distributed.get_rank()) and pass "
                    f"--no-{trainer.options['strategy']}-distributed-sampler.")
            raise ConfigError(
                f"the {stage} dataloader uses its own sampler ({type(sampler).__name__}); under "
                f"{trainer.options['strategy']} each rank must see a different shard of the data. "
                f"Wrap it in a DistributedSampler yourself, or pass "
                f"--no-{trainer.options['strategy']}-distributed-sampler to use it as it is.")
        # overfit_batches reads the same batches every epoch (the core put them in order)
        shuffle = stage == "train" and not trainer.overfit_batches and (
            self.train_shuffle == "always" or isinstance(sampler, RandomSampler))
        # the Trainer's seed, else the job's last seed_everything (every rank's is the same)
        seed = trainer.seed if trainer.seed is not None else (last_seed() or 0)
        return rebuild_dataloader(loader, sampler=DistributedSampler(
            loader.dataset, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
            drop_last=False))

    @hookimpl
    def on_epoch_start(self, trainer: Trainer) -> None:
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(trainer.current_epoch)

    # -- metrics, checkpoints -----------------------------------------------------------------

    @hookimpl
    def reduce_metrics(self, trainer: Trainer, metrics: dict[str, torch.Tensor],
                       op: str) -> dict[str, torch.Tensor]:
        if not metrics:
            return metrics
        names = list(metrics)
        shapes = [metrics[n].shape for n in names]
        flat = torch.cat([metrics[n].detach().float().reshape(-1).to(trainer.device)
                          for n in names])
        replicas, group = self.metric_replicas(trainer)
        dist.all_reduce(flat, op=_OPS[op], group=group)  # one collective for all of them
        if op == "mean":
            flat = flat / replicas
        parts = flat.split([shape.numel() for shape in shapes])
        return {n: part.reshape(shape) for n, part, shape in zip(names, parts, shapes)}

    @hookimpl
    def all_gather_object(self, trainer: Trainer, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * trainer.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    @hookimpl(wrapper=True)
    def save_checkpoint(self, trainer: Trainer):
        # a barrier (no rank goes on, and may read it, before the file is complete) that also
        # tells every rank whether any could not write: all stop, or all train on
        refused: CheckpointWriteError | None = None
        try:
            written = yield
        except CheckpointWriteError as exc:  # e.g. rank 0's disk is full
            refused = exc
        self._all_refuse_if_one_did(trainer, refused)
        return written

    @hookimpl(wrapper=True)
    def save_checkpoint_in_background(self, trainer: Trainer):
        # a write refused while a plugin copies it is every rank's refusal (fsdp's own folder
        # is made in the background); one refused later is agreed on when it ends
        # (WriteAgreement)
        refused: CheckpointWriteError | None = None
        writes = []
        try:
            writes = yield
        except CheckpointWriteError as exc:
            refused = exc
        self._all_refuse_if_one_did(trainer, refused)
        return writes

    def _all_refuse_if_one_did(self, trainer: Trainer,
                               refused: CheckpointWriteError | None) -> None:
        """Every rank raises the first rank's refusal, so that whichever the launcher reports
        reads alike; a collective."""
        reasons = self.all_gather_object(trainer, None if refused is None else str(refused))
        failed = [(rank, reason) for rank, reason in enumerate(reasons) if reason]
        if failed:
            rank, reason = failed[0]
            raise CheckpointWriteError(f"rank {rank}: {reason}") from refused


def held_bytes(model: torch.nn.Module,
               optimizers: list[torch.optim.Optimizer]) -> dict[str, int]:
    """Bytes of the parameters, gradients and optimizer state tensors this rank holds; of a
    sharded tensor (DTensor) only the local shard counts, and of a ``ZeroRedundancyOptimizer``
    only the state of its own partition. Gradients exist between backward and ``zero_grad``:
    measure there (``on_before_optimizer_step``)."""

    def size(tensor: torch.Tensor) -> int:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return local.numel() * local.element_size()

    params = list(model.parameters())
    state = 0
    for optimizer in optimizers:
        inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own shard
        for per_param in inner.state.values():
            state += sum(size(v) for v in per_param.values() if isinstance(v, torch.Tensor))
    return {"parameters": sum(size(p) for p in params),
            "gradients": sum(size(p.grad) for p in params if p.grad is not None),
            "optimizer_state": state}


def all_gather_tensor(tensor: torch.Tensor, group: Any = None,
                      sync_grads: bool = False) -> torch.Tensor:
    """Every process's ``tensor`` (each of the same shape), stacked along a new first dimension
    in rank order; without a process group of more than one process, ``tensor`` itself.
    ``sync_grads=True`` lets gradients flow back through the gather to each process's own
    ``tensor``. A collective: every process of ``group`` (the whole world by default) calls it."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return tensor
    if sync_grads:
        import torch.distributed.nn.functional as dist_fn

        return torch.stack(dist_fn.all_gather(tensor.contiguous(),
                                              group=group or dist.group.WORLD))
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor.contiguous(), group=group)
    return torch.stack(gathered)


_SET_BY = {"torchelastic": "torchrun", "slurm": "ptrain from SLURM's variables",
           "environment": "the environment"}


def _check_one_checkpoint(trainer: Trainer) -> None:
    """Raise :class:`ConfigError` unless every rank starts from the same checkpoint, one it can
    read. Each rank resolves ``ckpt_path`` (``last``, ``auto``) in the run root as its own
    machine sees it: where that is not one shared filesystem, one machine would resume while
    another starts from scratch, and the job would go on with ranks at different steps."""
    path = trainer.ckpt_path
    if path is not None:  # one file named two ways (relative, absolute) is one checkpoint
        path = os.path.normpath(os.path.abspath(path))
    mine = (path, path is None or Path(path).exists(), socket.gethostname())
    seen: list[Any] = [None] * trainer.world_size
    dist.all_gather_object(seen, mine)
    if all(found == seen[0][0] and readable for found, readable, _ in seen):
        return
    lines = "; ".join(
        f"rank {rank} ({host}): {found if found else 'no checkpoint (from the start)'}"
        + ("" if readable else ", which it can't read") for rank, (found, readable, host)
        in enumerate(seen))
    raise ConfigError(
        f"the processes of this job would not start from one checkpoint: {lines}. Each machine "
        f"reads the run root ({trainer.run_root}) from its own filesystem; give every machine "
        f"the same --default-root-dir on a filesystem they share, or a checkpoint path that "
        f"each of them can read (with a run root on each machine's own disk, "
        f"--save-on-each-node writes each machine's checkpoints there).")


def _doing(trainer: Trainer) -> str:
    """What this rank is doing, for its heartbeat."""
    if trainer.stage == "train":
        head = (f"training (epoch {trainer.current_epoch}, global step {trainer.global_step}, "
                f"batch {getattr(trainer, 'batch_idx', 0)})")
    else:
        head = f"in {trainer.stage}" if trainer.stage else "between stages"
    return f"{head}, in {rank_watch.where_main_thread_is()}"


def _destroy_process_group() -> None:
    rank_watch.finishing()
    script_launch.end_copies()  # the ranks this process started finish with the group up
    if dist.is_initialized():
        dist.destroy_process_group()
    stalled = rank_watch.stall_error()
    rank_watch.stop("exited")
    if stalled is not None:  # a rank stopped responding as the job ended: it did not succeed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


__all__ = ["Environment", "ProcessGroupStrategy", "detect_environment", "held_bytes",
           "first_host", "launch_workers"]
