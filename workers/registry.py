"""The ``@handler`` registry: names a worker process can run, and the tenants each serves."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pending_actions.broker.models import check_handler_name, check_tenant

F = TypeVar("F", bound=Callable[..., Any])

_HANDLERS: dict[str, Callable[..., Any]] = {}
# name -> the only tenants whose actions it runs (a handler not here serves every tenant)
_TENANTS: dict[str, tuple[str, ...]] = {}


def handler(name: str, tenants: Iterable[str] | None = None) -> Callable[[F], F]:
    """Register ``fn`` under ``name``. It is called with keyword arguments ``action``
    (a PendingAction), ``reason``, ``extra`` and ``idempotency_key``, and returns a str, a dict
    with ``content`` (and optional ``details``), or None. Raise ``broker.ToolError`` to send a
    message to the model unchanged. ``tenants``: the only tenants it serves (an MCP upstream
    set up for one customer, say): a stage naming it in another tenant's session is refused
    (``Denied``), and a worker never runs it for one."""
    check_handler_name("handler", name)
    kept = None if tenants is None else tuple(sorted({check_tenant(t) for t in tenants}))
    if kept == ():
        raise ValueError(f"handler {name!r}: an empty list of tenants serves nobody")

    def register(fn: F) -> F:
        existing = _HANDLERS.get(name)
        if existing is not None and existing is not fn and (
            existing.__module__, existing.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"handler {name!r} is already registered by {existing!r}")
        _HANDLERS[name] = fn
        if kept is None:
            _TENANTS.pop(name, None)
        else:
            _TENANTS[name] = kept
        return fn

    return register


def serving(name: str, tenant: str) -> Callable[..., Any]:
    """The handler ``name`` for an action of ``tenant``; LookupError when this worker has none
    or it serves other tenants only (a stage is refused before that: this guards a worker
    whose tenants differ from the fleet's)."""
    fn = _HANDLERS.get(name)
    if fn is None:
        raise LookupError(f"no handler named {name!r} in this worker")
    allowed = _TENANTS.get(name)
    if allowed is not None and tenant not in allowed:
        # which tenants it serves is theirs to know, not this one's
        raise LookupError(f"handler {name!r} does not serve tenant {tenant!r}")
    return fn


def names() -> list[str]:
    return sorted(_HANDLERS)


def tenants() -> dict[str, list[str]]:
    """The handlers kept to some tenants: name -> those tenants."""
    return {name: list(kept) for name, kept in sorted(_TENANTS.items())}
