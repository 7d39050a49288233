"""An example producer that edits real files. ``propose_edit`` previews a change as a unified
diff and stages it with the file's content hash as the fingerprint; the worker's handler
``examples.write_file`` (``workers/examples.py``) writes it atomically (a temp file, then a
rename) or raises ``Stale`` if the file changed since the preview.

``python -m pending_actions.producers.example DIR`` runs a few sessions that edit files in DIR
forever, now and then changing a file behind a preview's back; the worker must see DIR at the
same path (the same machine, or a shared volume). Without DIR it runs the deployment smoke loop
docker-compose uses, where producer and workers share no filesystem: sessions that stage
echoing edits and resolve them, forever."""

from __future__ import annotations

import difflib
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pending_actions.broker.errors import RedisUnavailable, UnknownHandler
from pending_actions.broker.fingerprint import file_fingerprint
from pending_actions.producers.client import PendingActions
from pending_actions.producers.tool import render

EDIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1},
        "content": {"type": "string"},
        "diff": {"type": "string"},
    },
    "required": ["path", "content"],
    "additionalProperties": False,
}


def unified_diff(path: Path, new_text: str) -> str:
    old = path.read_text() if path.exists() else ""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new_text.splitlines(keepends=True),
                                        fromfile=f"a/{path.name}", tofile=f"b/{path.name}"))


def propose_edit(pa: PendingActions, session: str, path: str | Path, new_text: str,
                 ttl: float | None = None) -> str:
    """Stage writing ``new_text`` to ``path``: the preview is the diff, the fingerprint the
    file's content hash now. Returns the pending action's id."""
    target = Path(path).resolve()
    return pa.stage(session=session, tool="edit", label=f"Edit {target.name}",
                    apply="examples.write_file",
                    payload={"path": str(target), "content": new_text,
                             "diff": unified_diff(target, new_text)},
                    fingerprint=file_fingerprint(target), schema=EDIT_SCHEMA, ttl=ttl)


def edit_files(pa: PendingActions, folder: Path, sessions: list[str]) -> None:
    session = random.choice(sessions)
    path = folder / f"{session}.txt"
    propose_edit(pa, session, path, f"edited at {time.ctime()}\n", ttl=60)
    if random.random() < 0.2:  # someone else edits the file after the preview
        path.write_text("changed behind the preview's back\n")
    action = random.choice(["apply", "apply", "discard"])
    print(render(pa.resolve(session=session, action=action, reason="example")), flush=True)


def echo_edits(pa: PendingActions, sessions: list[str]) -> None:
    session = random.choice(sessions)
    pa.stage(session=session, tool="edit", label=f"edit #{random.randint(1, 999)}",
             apply=random.choice(["examples.echo", "examples.fail_once"]),
             reject="examples.reject", payload={"path": "a.py"})
    action = random.choice(["apply", "apply", "discard"])
    print(render(pa.resolve(session=session, action=action, reason="example")), flush=True)


def main() -> None:
    # as PID 1 of a container a signal without a handler is ignored: stop on `docker stop`
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    pa = PendingActions()
    sessions = [f"example-{i}" for i in range(int(os.environ.get("EXAMPLE_SESSIONS", "2")))]
    while True:
        try:
            if folder is not None:
                edit_files(pa, folder.resolve(), sessions)
            else:
                echo_edits(pa, sessions)
        except (UnknownHandler, RedisUnavailable) as exc:
            print(f"waiting for the worker: {exc}", flush=True)
            time.sleep(2)  # a demo loop: retry slowly until a worker registers its handlers
        time.sleep(1)


if __name__ == "__main__":
    main()
