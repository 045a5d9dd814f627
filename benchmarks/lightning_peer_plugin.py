"""The part of ``lightning_peer_tests.py`` that runs inside each pytest process it starts.

Loaded with ``-p lightning_peer_plugin`` (this folder is on ``PYTHONPATH``). It holds:

* a report log: one JSON line per test phase (``setup``/``call``/``teardown``) with the outcome,
  the exception's type, the first lines of its message and, for a failure, the deepest frame in
  ptrain's own code; a ``start`` line before each test (so a run that dies mid-test says which
  one) and a line per collection error;
* a per-test time limit: ``SIGALRM`` raises :class:`PeerTimeout` in the test after
  ``--peer-timeout`` seconds per phase; a phase stuck in C code past three times that ends the
  process through :mod:`faulthandler` (the harness then resumes the file after that test);
* tolerant imports for the rewritten test files (:func:`peer_from`, :func:`peer_module`): a
  module-level import of a name ``ptrain.lightning`` lacks binds a stand-in (:class:`Absent`)
  instead of failing the whole file, and each test that uses such a name (found from its source
  by the harness, ``--peer-refs``) fails at set-up with the ``ImportError`` a user would see.
  Stand-ins are lenient while modules are collected (a class may subclass one, a decorator may
  touch one) and raise on any use once collection is over.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

#: (the importing module's ``__name__``, the local name) -> the ImportError a user would see
ABSENT: dict[tuple[str, str], str] = {}
_STRICT = False
_LOG: Any = None
_REFS: dict[str, list[list[str]]] = {}
_TIMEOUT = 300.0
#: where ptrain's code lives (this file is in the repository's benchmarks/)
_PTRAIN_CODE = tuple(str(Path(__file__).resolve().parent.parent / part) + "/"
                     for part in ("core", "plugins"))
#: joins an import error to the name that needed it (the harness groups by what comes before)
NEEDED_FOR = "-- needed for"


class PeerTimeout(Exception):
    """A test phase ran past ``--peer-timeout`` seconds."""


# --- tolerant imports (used by the rewritten files) ---------------------------------------------

class Absent:
    """Stands for a name that could not be imported. Lenient during collection, raising after."""

    def __init__(self, message: str, name: str):
        object.__setattr__(self, "_message", message)
        object.__setattr__(self, "__name__", name)
        object.__setattr__(self, "__qualname__", name)

    def _use(self):
        if _STRICT:
            raise ImportError(self._message)
        return Absent(self._message, self.__name__)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._use()

    def __setattr__(self, name: str, value: Any) -> None:
        raise ImportError(self._message)

    def __call__(self, *args: Any, **kwargs: Any):
        return self._use()

    def __getitem__(self, item: Any):
        return self._use()

    def __bool__(self) -> bool:
        if _STRICT:
            raise ImportError(self._message)
        return False

    def __or__(self, other: Any):
        return self._use()

    __ror__ = __or__

    def __mro_entries__(self, bases: tuple) -> tuple:
        message = self._message

        def refuse(*args: Any, **kwargs: Any):
            raise ImportError(message)
        return (type(f"Absent_{self.__name__}", (), {"__init__": refuse}),)

    def __repr__(self) -> str:
        return f"<absent under ptrain: {self.__name__}>"


def _absent(caller: str, local: str, name: str, message: str) -> Absent:
    ABSENT[(caller, local)] = message
    return Absent(message, name)


def peer_from(module: str, names: tuple[tuple[str, str], ...], caller: str) -> list[Any]:
    """``from module import name as local, ...`` that binds :class:`Absent` for what is missing."""
    try:
        mod, error = importlib.import_module(module), None
    except Exception as exc:  # noqa: BLE001 - any import failure becomes the stand-in's message
        mod, error = None, f"{type(exc).__name__}: {exc}"
    values = []
    for name, local in names:
        if mod is not None:
            if hasattr(mod, name):
                values.append(getattr(mod, name))
                continue
            try:
                values.append(importlib.import_module(f"{module}.{name}"))
                continue
            except ModuleNotFoundError:
                pass
            except Exception as exc:  # noqa: BLE001
                error = f"{type(exc).__name__}: {exc}"
        message = (f"cannot import name {name!r} from {module!r}" if error is None
                   else f"{error} {NEEDED_FOR} {name!r}")
        values.append(_absent(caller, local, name, message))
    return values


def peer_module(module: str, caller: str, local: str) -> Any:
    """``import module as local`` (or ``import module``: ``local`` is then its first part)."""
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001
        return _absent(caller, local, module, f"{type(exc).__name__}: {exc}")
    if local == module.split(".")[0]:
        return sys.modules[local]
    return imported


# --- the plugin ---------------------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("lightning-peer", "lightning_peer_tests.py's report log")
    group.addoption("--peer-log", help="append one JSON line per test phase here")
    group.addoption("--peer-timeout", type=float, default=300.0,
                    help="seconds a test phase may run before it is failed")
    group.addoption("--peer-refs", help="JSON: test -> module-level names its source uses")


def pytest_configure(config):
    global _LOG, _REFS, _TIMEOUT
    path = config.getoption("--peer-log")
    if path:
        _LOG = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the run
    refs = config.getoption("--peer-refs")
    if refs:
        _REFS = json.loads(Path(refs).read_text())
    _TIMEOUT = config.getoption("--peer-timeout")


def pytest_unconfigure(config):
    if _LOG is not None:
        _LOG.close()


def _write(record: dict) -> None:
    if _LOG is not None:
        _LOG.write(json.dumps(record) + "\n")


def test_key(item) -> str:
    """File and qualified name without parameters, then the parameter indices: the same test
    gets the same key in both runs even where its parameter ids print differently."""
    base = item.nodeid.split("[", 1)[0]
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return base
    indices = ",".join(f"{k}={v}" for k, v in sorted(callspec.indices.items()))
    return f"{base}[{indices}]"


def pytest_collectreport(report):
    if report.failed:
        text = str(report.longrepr)
        errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        _write({"event": "collect", "nodeid": report.nodeid,
                "message": "\n".join(errors[:3]) if errors else _first_lines(text,
                                                                               from_end=True)})


def pytest_collection_finish(session):
    global _STRICT
    _STRICT = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _write({"event": "start", "nodeid": item.nodeid, "key": test_key(item)})
    faulthandler.dump_traceback_later(_TIMEOUT * 3 + 60, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _alarm(signum, frame):
    raise PeerTimeout(f"the test phase ran past {_TIMEOUT:.0f} s (lightning_peer_tests.py's "
                      "per-test limit)")


def _limited():
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, _TIMEOUT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test whose source uses a name ``ptrain.lightning`` lacks fails here, as its import
    would have failed in a user's program, before its fixtures run."""
    for module, name in _REFS.get(item.nodeid.split("[", 1)[0], ()):
        if (module, name) in ABSENT:
            raise ImportError(ABSENT[(module, name)])


@pytest.hookimpl(hookwrapper=True, specname="pytest_runtest_setup")
def _limited_setup(item):
    yield from _limited()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _limited()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield from _limited()


def _first_lines(text: str, lines: int = 3, from_end: bool = False) -> str:
    parts = [line for line in text.strip().splitlines() if line.strip()]
    parts = parts[-lines:] if from_end else parts[:lines]
    return "\n".join(line[:2000] for line in parts)


def _ptrain_frame(excinfo) -> str | None:
    """The deepest traceback entry in ptrain's code (the core or a plugin), as file:line fn."""
    found = None
    for entry in excinfo.traceback:
        path = str(entry.path)
        if path.startswith(_PTRAIN_CODE):
            found = f"{path}:{entry.lineno + 1} {entry.name}"
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    record = {"event": "phase", "nodeid": report.nodeid, "when": report.when,
              "outcome": report.outcome, "duration": round(report.duration, 3)}
    if hasattr(report, "wasxfail"):
        record["xfail"] = report.wasxfail or "xfail"
    if report.skipped and isinstance(report.longrepr, tuple):
        record["reason"] = str(report.longrepr[2])
    elif report.failed and call.excinfo is not None:
        record["exc_type"] = call.excinfo.typename
        record["message"] = _first_lines(str(call.excinfo.value))
        record["where"] = _ptrain_frame(call.excinfo)
    elif report.failed:
        record["message"] = _first_lines(str(report.longrepr), from_end=True)
    _write(record)
