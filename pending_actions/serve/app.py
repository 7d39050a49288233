"""The HTTP API and the inbox page: the authorization boundary for people.

Every ``/v1`` route needs ``Authorization: Bearer <token>``. A token belongs to a tenant and a
role: no token or an unknown one is a 401, a role that may not do this is a 403, and a session
of another tenant is a 404 exactly like a session that does not exist, so a token cannot even
learn which sessions other tenants have. Resolves run the public client in worker threads (it
blocks on the reply), one thread per session in a batch, so one slow handler holds up only its
own session's items.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pending_actions.broker.errors import (
    Forbidden,
    InvalidInput,
    PendingActionsError,
    RedisUnavailable,
)
from pending_actions.broker.models import NAME_RE, Result
from pending_actions.producers import PendingActions
from pending_actions.serve import metrics
from pending_actions.serve.auth import Principal, Role, Tokens
from pending_actions.views import inbox

Handler = Callable[[Request], Awaitable[Response]]
RESOLVE_FIELDS = {"action", "reason", "extra", "edit", "expect_id"}
BATCH_FIELDS = {"session", "id", "action", "reason", "extra"}
MAX_BATCH = 100


class HTTPError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json",
                    headers=headers)


def _static(name: str) -> bytes:
    return (resources.files("pending_actions.serve") / "static" / name).read_bytes()


class Api:
    def __init__(self, pa: PendingActions, resolve_timeout_s: float | None = None) -> None:
        self.pa = pa
        self.tokens = Tokens(pa.client, pa.ctx.keys)
        self.timeout = resolve_timeout_s
        self.metrics = metrics.Metrics(pa)
        self.pages = {name: _static(name) for name in ("index.html", "inbox.js", "inbox.css")}

    # --- authorization -------------------------------------------------------------------
    def principal(self, request: Request, *roles: Role) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPError(401, "missing bearer token")
        who = self.tokens.lookup(token.strip())
        if who is None:
            raise HTTPError(401, "invalid or revoked token")
        if roles and not who.may(*roles):
            raise HTTPError(403, f"role {who.role!r} may not do this; needs "
                                 f"{' or '.join(roles)}")
        return who

    def owned(self, who: Principal, session: str) -> str:
        """404 unless the session exists and belongs to the token's tenant. A session's tenant
        is written by its first stage and never changes, so this check cannot go stale."""
        if not NAME_RE.match(session):
            raise HTTPError(404, "no such session")
        if self.pa.tenant_of(session) != who.tenant:
            raise HTTPError(404, "no such session")
        return session

    # --- routes ---------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.pa.client.ping)
        except Exception as exc:  # any failure to answer means not healthy
            return _json({"ok": False, "redis": str(exc)}, 503)
        return _json({"ok": True})

    async def metrics_text(self, request: Request) -> Response:
        await run_in_threadpool(self.principal, request, "admin")
        body = await run_in_threadpool(self.metrics.render)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    async def page(self, request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        types = {"html": "text/html; charset=utf-8", "js": "text/javascript",
                 "css": "text/css"}
        body = self.pages.get(name)
        if body is None:
            raise HTTPError(404, "not found")
        return Response(body, media_type=types[name.rsplit(".", 1)[1]],
                        headers={"cache-control": "no-cache"})

    async def get_inbox(self, request: Request) -> Response:
        def run() -> dict[str, Any]:
            who = self.principal(request)
            return {"tenant": who.tenant, "token": who.name, "role": who.role,
                    "now": time.time(), "actions": inbox(self.pa, who.tenant)}
        return _json(await run_in_threadpool(run))

    async def get_pending(self, request: Request) -> Response:
        def run() -> dict[str, Any]:
            session = self.owned(self.principal(request), request.path_params["session"])
            return {"session": session,
                    "pending": [a.model_dump() for a in self.pa.pending(session)]}
        return _json(await run_in_threadpool(run))

    async def stage(self, request: Request) -> Response:
        who = await run_in_threadpool(self.principal, request, "producer")
        body = await _body(request, dict)

        def run() -> dict[str, Any]:
            session = request.path_params["session"]
            unknown = set(body) - {"tool", "label", "apply", "reject", "payload"}
            if unknown:
                raise InvalidInput(sorted(unknown)[0], "unknown field")
            action_id = self.pa.stage(session=session, tenant=who.tenant, **body)
            return {"id": action_id, "session": session}
        return _json(await run_in_threadpool(run), 201)

    async def resolve(self, request: Request) -> Response:
        who = await run_in_threadpool(self.principal, request, "approver")
        body = await _body(request, dict)
        unknown = set(body) - RESOLVE_FIELDS
        if unknown:
            raise InvalidInput(sorted(unknown)[0], "unknown field")
        if body.get("edit") is not None:
            raise InvalidInput("edit", "payload edits are not supported by this server yet")
        session = await run_in_threadpool(self.owned, who, request.path_params["session"])
        result = await run_in_threadpool(self._resolve, who, session, body)
        return _json(result.model_dump(), 409 if _conflict(result) else 200)

    async def resolve_batch(self, request: Request) -> Response:
        who = await run_in_threadpool(self.principal, request, "approver")
        body = await _body(request, (dict, list))
        items = body.get("items") if isinstance(body, dict) else body
        if not isinstance(items, list) or not items:
            raise InvalidInput("items", "must be a non-empty list of {session, id, action, "
                                        "reason}")
        if len(items) > MAX_BATCH:
            raise InvalidInput("items", f"at most {MAX_BATCH} per batch")
        for n, item in enumerate(items):
            if not isinstance(item, dict) or not {"session", "id"} <= set(item) or \
                    set(item) - BATCH_FIELDS:
                raise InvalidInput(f"items.{n}", "must be {session, id, action, reason, "
                                                 "extra?}")
        results: list[Any] = [None] * len(items)
        by_session: dict[str, list[int]] = {}
        for n, item in enumerate(items):
            by_session.setdefault(str(item["session"]), []).append(n)

        def chain(session: str, order: list[int]) -> None:
            # in the order given: each item's id is checked against the target its
            # predecessors left
            for n in order:
                item = items[n]
                out: dict[str, Any] = {"session": session, "id": item["id"]}
                try:
                    self.owned(who, session)
                    fields = {k: v for k, v in item.items() if k not in ("session", "id")}
                    result = self._resolve(who, session, {**fields, "expect_id": item["id"]})
                    out.update(status=409 if _conflict(result) else 200,
                               result=result.model_dump())
                except HTTPError as exc:
                    out.update(status=exc.status, error=str(exc))
                except InvalidInput as exc:
                    out.update(status=400, error=str(exc), field=exc.field)
                results[n] = out

        await asyncio.gather(*(run_in_threadpool(chain, s, order)
                               for s, order in by_session.items()))
        return _json({"results": results})

    def _resolve(self, who: Principal, session: str, body: dict[str, Any]) -> Result:
        started = time.perf_counter()
        result = self.pa.resolve(session=session, action=body.get("action"),  # type: ignore[arg-type]
                                 reason=body.get("reason"),  # type: ignore[arg-type]
                                 extra=body.get("extra"), expect_id=body.get("expect_id"),
                                 by=who.name, timeout=self.timeout)
        self.metrics.observe_resolve(str(body.get("action")), result,
                                     time.perf_counter() - started)
        return result


def _conflict(result: Result) -> bool:
    return result.is_error and "expect_id" in result.details


async def _body(request: Request, kinds: type | tuple[type, ...]) -> Any:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidInput("body", f"not JSON: {exc}") from None
    if not isinstance(body, kinds):
        raise InvalidInput("body", "must be a JSON object")
    return body


def _errors(fn: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except HTTPError as exc:
            headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
            return _json({"error": str(exc)}, exc.status, headers)
        except InvalidInput as exc:
            return _json({"error": str(exc), "field": exc.field}, 400)
        except Forbidden:  # another tenant's session: the same answer as none at all
            return _json({"error": "no such session"}, 404)
        except RedisUnavailable as exc:
            return _json({"error": str(exc)}, 503)
        except PendingActionsError as exc:
            return _json({"error": str(exc)}, 500)
    return wrapped


def create_app(pa: PendingActions, resolve_timeout_s: float | None = None) -> Starlette:
    api = Api(pa, resolve_timeout_s)
    routes = [
        Route("/", _errors(api.page)),
        Route("/static/{name}", _errors(api.page)),
        Route("/healthz", api.healthz),
        Route("/metrics", _errors(api.metrics_text)),
        Route("/v1/inbox", _errors(api.get_inbox)),
        Route("/v1/sessions/{session}/pending", _errors(api.get_pending)),
        Route("/v1/sessions/{session}/actions", _errors(api.stage), methods=["POST"]),
        Route("/v1/sessions/{session}/resolve", _errors(api.resolve), methods=["POST"]),
        Route("/v1/resolve-batch", _errors(api.resolve_batch), methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        api.metrics.start()
        yield
        api.metrics.stop.set()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.api = api
    return app

