"""Lightning's cluster environments: where a process reads its ranks and rendezvous.

ptrain reads the environment itself (torchrun's ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``, SLURM's
``SLURM_PROCID``...; see ``ptrain.distributed.detect_environment``), so these objects answer
Lightning's questions (``detect()``, ``world_size()``, ``global_rank()``, ``main_address``...)
from the same variables, and given in ``Trainer(plugins=[...])`` they ask for nothing more:
``LightningEnvironment`` and ``TorchElasticEnvironment`` are what ptrain does anyway, and
``SLURMEnvironment(auto_requeue=...)`` sets the ``stop-signals`` callback's ``requeue`` (and adds
``requeue_signal`` to its signals). Kubeflow, LSF, MPI and XLA environments are refused when
made: ptrain does not read their variables.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from ptrain.errors import ConfigError

__all__ = ["ClusterEnvironment", "KubeflowEnvironment", "LSFEnvironment",
           "LightningEnvironment", "MPIEnvironment", "SLURMEnvironment",
           "TorchElasticEnvironment", "XLAEnvironment"]


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class ClusterEnvironment:
    """The base: a process's ranks and its job's rendezvous, read from the environment
    (torch's variables: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``). ``ptrain_options`` are the options it implies for ptrain's
    plugins (plugin name -> options)."""

    def __init__(self) -> None:
        self._world_size: int | None = None
        self._global_rank: int | None = None

    @property
    def ptrain_options(self) -> dict[str, dict[str, Any]]:
        return {}

    @property
    def creates_processes_externally(self) -> bool:
        """Whether a launcher other than the program (torchrun, srun) started the processes."""
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return _int("MASTER_PORT", 0)

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._world_size if self._world_size is not None else _int("WORLD_SIZE", 1)

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank if self._global_rank is not None else _int("RANK", 0)

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return _int("LOCAL_RANK", 0)

    def node_rank(self) -> int:
        return _int("NODE_RANK", _int("GROUP_RANK", 0))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Lightning's check of the Trainer's devices against the environment (none here)."""

    def teardown(self) -> None:
        """Clean up at the end (nothing here)."""


class LightningEnvironment(ClusterEnvironment):
    """The processes a program starts itself (Lightning's default; ptrain's launchers)."""

    @property
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ


class TorchElasticEnvironment(ClusterEnvironment):
    """Processes started by ``torchrun``."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @staticmethod
    def detect() -> bool:
        """Whether ``torchrun`` started this process (it sets ``TORCHELASTIC_RUN_ID``)."""
        return "TORCHELASTIC_RUN_ID" in os.environ

    def node_rank(self) -> int:
        return _int("GROUP_RANK", 0)


class SLURMEnvironment(ClusterEnvironment):
    """Processes started by SLURM's ``srun``. ``auto_requeue`` sets ptrain's ``stop-signals``
    ``requeue`` (on a signal the job saves a resumable checkpoint and requeues itself);
    ``requeue_signal`` is added to that callback's signals (it stops on SIGTERM, SIGINT and
    SIGUSR1 already)."""

    def __init__(self, auto_requeue: bool = True,
                 requeue_signal: signal.Signals | None = None) -> None:
        super().__init__()
        self.auto_requeue = auto_requeue
        self.requeue_signal = requeue_signal

    @property
    def ptrain_options(self) -> dict[str, dict[str, Any]]:
        from ptrain.builtins.stop_signals import DEFAULT_SIGNALS

        options: dict[str, Any] = {"requeue": bool(self.auto_requeue)}
        if self.requeue_signal is not None:
            name = signal.Signals(self.requeue_signal).name
            options["signals"] = list(dict.fromkeys([*DEFAULT_SIGNALS, name]))
        return {"stop-signals": options}

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        from ptrain.distributed import first_host

        nodes = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        return first_host(nodes) if nodes else super().main_address

    @staticmethod
    def detect() -> bool:
        return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in (
            "bash", "interactive")

    @staticmethod
    def job_name() -> str | None:
        return os.environ.get("SLURM_JOB_NAME")

    @staticmethod
    def job_id() -> int | None:
        value = os.environ.get("SLURM_JOB_ID")
        return int(value) if value is not None else None

    def world_size(self) -> int:
        return _int("SLURM_NTASKS", 1)

    def global_rank(self) -> int:
        return _int("SLURM_PROCID", 0)

    def local_rank(self) -> int:
        return _int("SLURM_LOCALID", 0)

    def node_rank(self) -> int:
        return _int("SLURM_NODEID", 0)


class _Unread(ClusterEnvironment):
    """An environment whose variables ptrain does not read: refused when made."""

    launcher = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(
            f"{type(self).__name__}() is not supported by ptrain: it reads the ranks that "
            f"torchrun or SLURM set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; SLURM_PROCID), "
            f"not {self.launcher}'s. Start the processes with torchrun (or set those variables "
            f"for each process) and leave the environment out of Trainer(plugins=...). See "
            f"\"Coming from Lightning\" in ptrain's documentation.")


class KubeflowEnvironment(_Unread):
    launcher = "Kubeflow's PyTorchJob"


class LSFEnvironment(_Unread):
    launcher = "IBM LSF"


class MPIEnvironment(_Unread):
    launcher = "MPI"


class XLAEnvironment(_Unread):
    launcher = "torch_xla"
