"""The resolve worker and the dramatiq actors that run registered handlers, with the dramatiq
side they share: the task message (``tasks.py``) and our Redis streams broker
(``taskbroker.py``)."""

# One import name, so one copy of every class (an ``except Stale`` catches every Stale): from
# the repo root ``workers`` is importable too, and is refused before it loads anything.
if __name__ != "pending_actions.workers":
    raise ImportError(f"import pending_actions.workers, not {__name__}", name=__name__)

from pending_actions.workers.registry import handler

__all__ = ["handler"]
