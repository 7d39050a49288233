"""Process supervision for ``up`` and ``worker``: a resolve worker in this process, dramatiq
worker processes beside it, and an embedded redis-server for ``up``. Ctrl-C, SIGTERM or SIGHUP
(the terminal closed) stops them in order: stop taking requests, let running handlers finish,
then stop Redis. If this process dies without that (SIGKILL), the kernel sends its children
SIGTERM (see ``procs``), and dramatiq passes it on to its worker processes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
from dramatiq.cli import RET_IMPORT, RET_PIDFILE

from pending_actions.broker import backoff, tracing
from pending_actions.broker.context import Context
from pending_actions.broker.errors import ConfigError
from pending_actions.broker.loops import EXIT_LOOP_DIED
from pending_actions.broker.preflight import preflight
from pending_actions.broker.settings import Settings
from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import Child
from pending_actions.webhooks import parse_urls
from pending_actions.workers.resolver import ResolveWorker
from pending_actions.workers.tasks import task_broker

log = logging.getLogger("pending_actions")


# see dramatiq_command
WORKER_FORK_TIMEOUT_MS = 1000


def dramatiq_command(modules: list[str], settings: Settings, shutdown_ms: int) -> list[str]:
    return [
        sys.executable, "-m", "dramatiq", "pending_actions.workers.actors",
        *(["pending_actions.webhooks.delivery"] if settings.webhook_urls else []),
        *(["pending_actions.mcp.worker"] if settings.mcp_upstreams else []), *modules,
        "--processes", str(settings.worker_processes),
        "--threads", str(settings.worker_threads),
        "--worker-shutdown-timeout", str(shutdown_ms),
        # dramatiq's main process waits this long for each worker process to say it booted,
        # and a worker says so only after its consumers started: one that a handler kills in
        # between (a task already queued for it) held the main process, and so every restart,
        # for the default 30 s. We start no fork processes, which is all the wait is for.
        "--worker-fork-timeout", str(WORKER_FORK_TIMEOUT_MS),
        "--path", os.getcwd(),
    ]


# run in a child process: a module's import side effects (a thread, a connection) stay there
IMPORT_CHECK = """
import importlib, json, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        sys.stderr.write("\\0" + json.dumps([name, f"{type(exc).__name__}: {exc}"]))
        sys.exit(3)
"""
IMPORT_CHECK_S = 120.0


def check_handler_modules(settings: Settings, modules: list[str]) -> None:
    """Each handler module imports, or ConfigError naming it and what its import raised:
    before anything starts, so a misspelt module is one line and no dramatiq traceback. Tried
    in a child process from this directory, as dramatiq imports them (``--path``), with the
    Redis URL in its environment when it is known yet (``up`` has none before its Redis)."""
    if not modules:
        return
    env = dict(os.environ)
    if settings.redis_url:
        env["PENDING_ACTIONS_REDIS_URL"] = settings.redis_url
    try:
        done = subprocess.run([sys.executable, "-c", IMPORT_CHECK, *modules], cwd=os.getcwd(),
                              env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=IMPORT_CHECK_S, check=False)
    except subprocess.TimeoutExpired:  # a slow import is no verdict: dramatiq tries it
        log.warning("importing %s took over %.0fs; starting anyway", ", ".join(modules),
                    IMPORT_CHECK_S)
        return
    if done.returncode == 0:
        return
    try:
        name, why = orjson.loads(done.stderr.rpartition("\0")[2])
    except orjson.JSONDecodeError:  # it died otherwise (a module that exits, a signal)
        raise ConfigError(f"importing the handler modules {', '.join(modules)} failed "
                          f"(exit {done.returncode})") from None
    first = why.strip().splitlines()[0] if why.strip() else why
    raise ConfigError(f"cannot import handler module {name!r}: {first}")


def check_id_file(settings: Settings) -> None:
    """The folder of ``WORKER_ID_FILE`` is there to write in, or ConfigError: a worker whose
    name cannot be written would never pass its healthcheck, without saying why. A file left
    there names a worker that did not stop cleanly (a container restarted after a kill keeps
    its files), which looks alive for a few seconds more: removed, so that the check fails
    until this worker runs."""
    if not settings.worker_id_file:
        return
    folder = Path(settings.worker_id_file).absolute().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write the worker id file {settings.worker_id_file}: "
                          f"{folder} is not a folder this process may write in")
    with contextlib.suppress(FileNotFoundError):
        Path(settings.worker_id_file).unlink()


def write_id_file(path: str, name: str) -> None:
    """``name`` into ``path`` whole or not at all (a healthcheck reads it at any moment)."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_text(name + "\n")
    os.replace(partial, target)


def remove_id_file(path: str, name: str) -> None:
    """At a clean stop, unless another worker has written its own name there since."""
    with contextlib.suppress(OSError):
        if Path(path).read_text().strip() == name:
            Path(path).unlink()


def check_mcp_upstreams(settings: Settings) -> None:
    """Each MCP upstream starts and lists its tools, or ConfigError naming it and why: before
    anything starts, so that a command that does not run is one line, not a failed apply."""
    if not settings.mcp_upstreams:
        return
    try:
        import anyio

        from pending_actions.mcp.client import UpstreamError, probe, quiet_sdk_logs
    except ImportError as exc:
        raise ConfigError(f"--mcp-upstream needs the 'mcp' extra ({exc.name} is missing): "
                          "pip install 'pending-actions[mcp]'") from None
    from pending_actions.mcp.upstreams import configured

    quiet_sdk_logs()
    for up in configured(settings).values():
        try:
            tools = anyio.run(probe, up, settings.mcp_start_timeout_s,
                              settings.mcp_call_timeout_s, settings.mcp_max_result_bytes)
        except UpstreamError as exc:
            raise ConfigError(str(exc)) from None
        log.info("MCP upstream %s: %d tools, applied by handler %s", up.name, len(tools),
                 up.handler)


def run(settings: Settings, modules: list[str], *, embedded: EmbeddedRedis | None = None,
        shutdown_s: float = 30.0) -> int:
    # what can be refused before anything starts (and before "running" is said)
    parse_urls(settings.webhook_urls)
    check_id_file(settings)
    check_handler_modules(settings, modules)
    check_mcp_upstreams(settings)
    tracing.setup("pending-actions-worker")  # the resolve worker's spans; from OTEL_* alone
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)

    if embedded is None:
        return _supervise(settings, modules, stop, shutdown_s)
    embedded.start()
    try:
        log.info("embedded redis-server %s on %s (data in %s)", embedded.binary, embedded.url,
                 embedded.directory)
        print(f"export PENDING_ACTIONS_REDIS_URL={embedded.url}", flush=True)
        url = {"redis_url": embedded.url}
        return _supervise(settings.model_copy(update=url), modules, stop, shutdown_s)
    finally:
        embedded.stop()  # last: the workers above may still have written outcomes


def _supervise(settings: Settings, modules: list[str], stop: threading.Event,
               shutdown_s: float) -> int:
    """Run the resolve worker here and dramatiq beside it until ``stop``; restart dramatiq when
    it exits; return the exit code."""
    env = {**os.environ, "PENDING_ACTIONS_REDIS_URL": settings.require_url()}
    if settings.dramatiq_url:
        env["PENDING_ACTIONS_DRAMATIQ_URL"] = settings.dramatiq_url
    if settings.mcp_upstreams:  # with the --mcp-upstream options (pending_actions.mcp.worker)
        env["PENDING_ACTIONS_MCP_UPSTREAMS"] = orjson.dumps(settings.mcp_upstreams).decode()
        env["PENDING_ACTIONS_MCP_UPSTREAM_TENANTS"] = orjson.dumps(
            settings.mcp_upstream_tenants).decode()
    command = dramatiq_command(modules, settings, int(shutdown_s * 1000))
    name = ResolveWorker.new_name()
    # the dramatiq processes name this one as the process that restarts them (health)
    env["PENDING_ACTIONS_SUPERVISOR"] = name

    def spawn() -> Child:
        # its own process group (procs), out of reach of a terminal's Ctrl-C: dramatiq takes a
        # second signal as "kill now", so it must get exactly one, the SIGTERM sent below
        return Child("dramatiq", command, env=env).spawn()

    ctx = Context.create(settings, role="worker")
    # credentials, permissions, eviction policy: refused at once with one clear line, before
    # anything starts (never a worker that retries a wrong password for ever)
    preflight(ctx)
    died: list[int] = []

    def on_fatal(loop: str, exc: BaseException) -> None:
        log.critical("loop %s cannot go on (%s); stopping so that this worker is restarted",
                     loop, exc)
        died.append(EXIT_LOOP_DIED)
        stop.set()

    proc = spawn()
    try:
        resolver = ResolveWorker(ctx, task_broker(ctx), name, on_fatal=on_fatal).start()
    except BaseException:
        proc.stop(shutdown_s + 5)
        raise
    log.info("resolve worker %s and dramatiq (pid %d) running; Ctrl-C stops", resolver.name,
             proc.pid)
    if settings.worker_id_file:
        try:
            write_id_file(settings.worker_id_file, name)
        except OSError as exc:  # checked before the start: this is the disk failing
            log.error("cannot write the worker id file %s: %s", settings.worker_id_file, exc)
    code, restarts, started = 0, 0, time.monotonic()
    while not stop.wait(0.2):
        if proc.running():
            continue
        if proc.returncode in (RET_IMPORT, RET_PIDFILE):  # restarting cannot fix these
            log.error("dramatiq worker could not start (exit %s); stopping", proc.returncode)
            code = 1
            break
        # dramatiq stops all its processes when one dies (a handler that crashes the process,
        # an OOM kill). Leases bring back what was running; we bring back the workers.
        restarts = 0 if time.monotonic() - started > 30 else restarts + 1
        delay = backoff.delay(restarts, 0.1, settings.restart_backoff_max_s)
        log.error("dramatiq worker exited with %s; restarting in %.1fs", proc.returncode, delay)
        if stop.wait(delay):
            break
        proc, started = spawn(), time.monotonic()
    # both stop at once: the resolver's threads may sit in a blocking read for block_ms
    proc.terminate()  # dramatiq lets running handlers finish, bounded
    resolver.shutdown()
    proc.stop(shutdown_s + 5)
    resolver.beats.stopped()  # gone, not a process that stopped beating
    if settings.worker_id_file:
        remove_id_file(settings.worker_id_file, name)
    return died[0] if died else code


def embedded_for(data_dir: Path, port: int) -> EmbeddedRedis:
    return EmbeddedRedis(directory=data_dir, port=port)
