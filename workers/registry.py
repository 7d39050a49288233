"""The ``@handler`` registry: names a worker process can run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pending_actions.broker.models import check_handler_name

F = TypeVar("F", bound=Callable[..., Any])

_HANDLERS: dict[str, Callable[..., Any]] = {}


def handler(name: str) -> Callable[[F], F]:
    """Register ``fn`` under ``name``. It is called with keyword arguments ``action``
    (a PendingAction), ``reason``, ``extra`` and ``idempotency_key``, and returns a str, a dict
    with ``content`` (and optional ``details``), or None. Raise ``broker.ToolError`` to send a
    message to the model unchanged."""
    check_handler_name("handler", name)

    def register(fn: F) -> F:
        existing = _HANDLERS.get(name)
        if existing is not None and existing is not fn and (
            existing.__module__, existing.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"handler {name!r} is already registered by {existing!r}")
        _HANDLERS[name] = fn
        return fn

    return register


def get(name: str) -> Callable[..., Any] | None:
    return _HANDLERS.get(name)


def names() -> list[str]:
    return sorted(_HANDLERS)
