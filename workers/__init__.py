"""The resolve worker and the dramatiq actors that run registered handlers, with the dramatiq
side they share: the task message (``tasks.py``) and our Redis streams broker
(``taskbroker.py``)."""

from pending_actions.workers.registry import handler

__all__ = ["handler"]
