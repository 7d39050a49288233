"""Imports run one way: ``producers`` -> ``broker`` <- ``workers``. ``broker`` imports nothing
above it, producers never the workers, and neither of them dramatiq (the dramatiq side lives in
``workers/``), so an agent runtime that imports the package never loads it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported(part: str) -> dict[str, set[str]]:
    """File of ``part`` -> the absolute module names it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / part).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def outside(names: set[str], allowed: tuple[str, ...]) -> set[str]:
    """Names of this project, or dramatiq, that are not under one of ``allowed``."""
    ours = {n for n in names if n.split(".")[0] in ("pending_actions", "broker", "workers",
                                                     "producers", "dramatiq")}
    return {n for n in ours if not any(n == a or n.startswith(a + ".") for a in allowed)}


def test_broker_imports_only_itself() -> None:
    files = imported("broker")
    assert "broker/keys.py" in files
    wrong = {f: outside(names, ("pending_actions.broker",)) for f, names in files.items()}
    assert not any(wrong.values()), {f: n for f, n in wrong.items() if n}


def test_producers_import_the_broker_and_never_dramatiq_or_the_workers() -> None:
    files = imported("producers")
    assert "producers/client.py" in files
    allowed = ("pending_actions.broker", "pending_actions.producers")
    wrong = {f: outside(names, allowed) for f, names in files.items()}
    assert not any(wrong.values()), {f: n for f, n in wrong.items() if n}


def test_the_check_sees_a_wrong_import() -> None:
    assert outside({"dramatiq.broker", "pending_actions.workers.tasks", "redis",
                    "pending_actions.broker.keys"}, ("pending_actions.broker",)) == {
        "dramatiq.broker", "pending_actions.workers.tasks"}


def test_importing_the_package_and_its_clients_loads_no_dramatiq() -> None:
    code = ("import sys, pending_actions, pending_actions.producers.aio\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dramatiq'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    # and the check would see it: the workers' task module does load dramatiq
    code = code.replace("pending_actions.producers.aio", "pending_actions.workers.tasks")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert "'dramatiq'" in out.stdout, out.stdout
