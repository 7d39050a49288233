"""Real processes for the tests: workers started through the CLI with the test handlers."""

from __future__ import annotations

from pathlib import Path

from pending_actions_harness.supervise import WorkerProcess

TEST_ENV = {"PENDING_ACTIONS_WORKER_THREADS": "8", "PENDING_ACTIONS_BLOCK_MS": "1000",
            # short dramatiq idle/restart delays so that stops and reconnects are quick
            "dramatiq_worker_timeout": "200", "dramatiq_restart_delay": "100"}


def worker_env(url: str, **overrides: str) -> dict[str, str]:
    """The environment a test worker gets, for running other CLI commands the same way."""
    return Worker(url, overrides=overrides).environment()


class Worker(WorkerProcess):
    def __init__(self, url: str, handlers: str = "tests.support.handlers",
                 overrides: dict[str, str] | None = None, env: dict[str, str] | None = None,
                 log_path: Path | None = None) -> None:
        """``env``: more variables (OTEL_*, say); ``log_path``: where its output goes."""
        super().__init__(url, handlers, overrides, env={**TEST_ENV, **(env or {})},
                         log_path=log_path)
