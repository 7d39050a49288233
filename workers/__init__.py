"""The resolve worker and the dramatiq actors that run registered handlers."""

from pending_actions.workers.registry import handler

__all__ = ["handler"]
