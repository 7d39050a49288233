"""The HTTP API and the inbox page: the authorization boundary for people.

Every ``/v1`` route needs ``Authorization: Bearer <token>``. A token belongs to a tenant and a
role: no token or an unknown one is a 401, a role that may not do this is a 403, and a session
of another tenant is a 404 exactly like a session that does not exist, so a token cannot even
learn which sessions other tenants have. ``/metrics`` shows a token's own tenant only; the
deployment's figures are on the operator listener (``operator_app``), when one is configured.

Resolves wait on the asyncio client (``AsyncPendingActions``): a resolve waiting for a slow
handler holds no thread, so however many are waiting, reads (which run the blocking client
in the thread pool, briefly) still get a thread at once. A batch resolves its sessions
concurrently, each session's items in the order given.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import anyio
from annotated_types import MaxLen
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pending_actions.broker.errors import ConfigError, InvalidInput
from pending_actions.broker.models import NAME_RE, ResolveRequest, Result
from pending_actions.producers import AsyncPendingActions, PendingActions
from pending_actions.serve import metrics
from pending_actions.serve.auth import Principal, Role, Tokens
from pending_actions.serve.http import (
    HTTPError,
    Outage,
    SecurityHeaders,
    errors,
    json_response,
    read_json,
)
from pending_actions.views import inbox

RESOLVE_FIELDS = {"action", "reason", "extra", "edit", "expect_id", "revision"}
STAGE_FIELDS = {"tool", "label", "apply", "reject", "payload"}
BATCH_FIELDS = {"session", "id", "action", "reason", "extra", "revision"}
MAX_BATCH = 100
# the longest action id a resolve takes: the resolve request's own bound on expect_id
MAX_ID_CHARS = next(m.max_length for m in ResolveRequest.model_fields["expect_id"].metadata
                    if isinstance(m, MaxLen))
# resolves waiting at once; more wait their turn in serve (holding nothing). Each waiting one
# holds a connection for its reply's BLPOP, so the asyncio client's pool gets that many and
# room for the short commands beside them (redis-py's default of 100 would refuse the 101st)
MAX_RESOLVES = 1_000
ASYNC_CONNECTIONS = MAX_RESOLVES + 100
# resolves in threads, only where the asyncio client cannot run (a Redis Cluster with
# REPLICA_WAIT): a limiter of their own, so they never take the threads reads need
RESOLVE_THREADS = 2 * MAX_BATCH


def _static(name: str) -> bytes:
    return (resources.files("pending_actions.serve") / "static" / name).read_bytes()


class Api:
    def __init__(self, pa: PendingActions, resolve_timeout_s: float | None = None) -> None:
        self.pa = pa
        self.settings = pa.settings
        self.tokens = Tokens(pa.client, pa.ctx.keys)
        self.timeout = resolve_timeout_s
        # one for the routes, the scrapes and the feed: one warning line per outage
        self.outage = Outage("serve")
        self.metrics = metrics.Metrics(pa, self.outage)
        self.pages = {name: _static(name)
                      for name in ("index.html", "inbox.js", "inbox.css", "favicon.svg")}
        self._apa: AsyncPendingActions | None = None
        self._threads: anyio.CapacityLimiter | None = None
        self._resolving = asyncio.Semaphore(MAX_RESOLVES)

    # --- the clients -----------------------------------------------------------------------
    def aio(self) -> AsyncPendingActions | None:
        """The asyncio client, made on first use on the server's event loop (it binds its
        connections to it); None where it cannot run, and resolves take their own threads."""
        if self._apa is None and self._threads is None:
            try:
                self._apa = AsyncPendingActions(self.settings)
            except ConfigError:
                self._threads = anyio.CapacityLimiter(RESOLVE_THREADS)
                return None
            pool = getattr(self._apa.client, "connection_pool", None)
            if pool is not None:  # one server (a cluster client's pools are unbounded)
                pool.max_connections = ASYNC_CONNECTIONS
        return self._apa

    async def close(self) -> None:
        if self._apa is not None:
            await self._apa.close()

    # --- authorization ---------------------------------------------------------------------
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

    async def who(self, request: Request, *roles: Role) -> Principal:
        return await run_in_threadpool(self.principal, request, *roles)

    async def owned(self, who: Principal, session: str, *, new: bool = False) -> str:
        """404 unless the session belongs to the token's tenant (with ``new``, or belongs to
        nobody yet: a stage claims it). A session's tenant is written by its first stage and
        never changes, so this check cannot go stale."""
        if not NAME_RE.match(session):
            raise HTTPError(404, "no such session")
        apa = self.aio()
        owner = await (apa.tenant_of(session) if apa is not None
                       else run_in_threadpool(self.pa.tenant_of, session))
        if owner != who.tenant and not (new and owner is None):
            raise HTTPError(404, "no such session")
        return session

    # --- routes ----------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.pa.client.ping)
        except Exception as exc:  # any failure to answer means not healthy
            return json_response({"ok": False, "redis": str(exc)}, 503)
        return json_response({"ok": True})

    async def metrics_text(self, request: Request) -> Response:
        who = await self.who(request, "admin")
        body = await run_in_threadpool(self.metrics.render, who.tenant)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    async def page(self, request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        types = {"html": "text/html; charset=utf-8", "js": "text/javascript",
                 "css": "text/css", "svg": "image/svg+xml"}
        body = self.pages.get(name)
        if body is None:
            raise HTTPError(404, "not found")
        return Response(body, media_type=types[name.rsplit(".", 1)[1]],
                        headers={"cache-control": "no-cache"})

    async def get_inbox(self, request: Request) -> Response:
        def run() -> dict[str, Any]:
            who = self.principal(request)
            return {"tenant": who.tenant, "token": who.name, "role": who.role,
                    "now": time.time(),
                    "actions": inbox(self.pa, who.tenant, who.name)}
        return json_response(await run_in_threadpool(run))

    async def get_pending(self, request: Request) -> Response:
        who = await self.who(request)
        session = await self.owned(who, request.path_params["session"])
        pending = await run_in_threadpool(self.pa.pending, session)
        return json_response({"session": session, "pending": [a.model_dump() for a in pending]})

    async def stage(self, request: Request) -> Response:
        who = await self.who(request, "producer")
        body = await read_json(request, self.settings)
        unknown = set(body) - STAGE_FIELDS
        if unknown:
            raise InvalidInput(sorted(unknown)[0], "unknown field")
        # another tenant's session is refused before the stage is tried: it answers as a
        # missing one and leaves nothing behind (a stage racing this check is refused by the
        # stage itself, Forbidden: the same 404)
        session = await self.owned(who, request.path_params["session"], new=True)

        def run() -> str:
            return self.pa.stage(session=session, tenant=who.tenant, **body)

        return json_response({"id": await run_in_threadpool(run), "session": session}, 201)

    async def resolve(self, request: Request) -> Response:
        who = await self.who(request, "approver")
        body = await read_json(request, self.settings)
        unknown = set(body) - RESOLVE_FIELDS
        if unknown:
            raise InvalidInput(sorted(unknown)[0], "unknown field")
        session = await self.owned(who, request.path_params["session"])
        result = await self._resolve(who, session, body)
        return json_response(result.model_dump(), 409 if _conflict(result) else 200)

    async def resolve_batch(self, request: Request) -> Response:
        who = await self.who(request, "approver")
        body = await read_json(request, self.settings, (dict, list))
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
            refused = _bad_item(item)
            if refused is None:
                by_session.setdefault(item["session"], []).append(n)
            else:  # never resolved: a null id would go through as "whatever is on top"
                results[n] = {"session": item["session"], "id": item["id"], "status": 400,
                              "error": str(refused), "field": refused.field}

        async def chain(session: str, order: list[int]) -> None:
            # in the order given: each item's id is checked against the target its
            # predecessors left
            for n in order:
                item = items[n]
                out: dict[str, Any] = {"session": session, "id": item["id"]}
                try:
                    await self.owned(who, session)
                    fields = {k: v for k, v in item.items() if k not in ("session", "id")}
                    result = await self._resolve(who, session,
                                                 {**fields, "expect_id": item["id"]})
                    out.update(status=409 if _conflict(result) else 200,
                               result=result.model_dump())
                except HTTPError as exc:
                    out.update(status=exc.status, error=str(exc))
                except InvalidInput as exc:
                    out.update(status=400, error=str(exc), field=exc.field)
                results[n] = out

        await asyncio.gather(*(chain(s, order) for s, order in by_session.items()))
        return json_response({"results": results})

    async def _resolve(self, who: Principal, session: str, body: dict[str, Any]) -> Result:
        started = time.perf_counter()
        args: dict[str, Any] = {
            "session": session, "action": body.get("action"), "reason": body.get("reason"),
            "extra": body.get("extra"), "expect_id": body.get("expect_id"),
            "revision": body.get("revision"),
            # a person's edit: checked against the action's schema, it resets the approvals
            # given to the earlier payload (what people approve is what they saw)
            "edit": body.get("edit"),
            # a person's resolve: an approval of what a policy asks people for, through this
            # token (revoked, its approvals stop counting)
            "approver": who.name, "grant": who.grant or None, "tenant": who.tenant,
            "timeout": self.timeout}
        apa = self.aio()
        if apa is not None:
            async with self._resolving:
                result = await apa.resolve(**args)
        else:
            result = await anyio.to_thread.run_sync(lambda: self.pa.resolve(**args),
                                                    limiter=self._threads)
        self.metrics.observe_resolve(who.tenant, str(body.get("action")), result,
                                     time.perf_counter() - started)
        return result


    # --- policies -------------------------------------------------------------------------
    async def get_policy(self, request: Request) -> Response:
        who = await self.who(request, "admin")
        found = await run_in_threadpool(self.pa.get_policy, who.tenant)
        if found is None:
            raise HTTPError(404, f"tenant {who.tenant} has no policy")
        return json_response(found)

    async def put_policy(self, request: Request) -> Response:
        """The body is the policy document itself (JSON): checked, then a new version."""
        who = await self.who(request, "admin")
        body = await read_json(request, self.settings)

        def run() -> int:
            return self.pa.set_policy(body, tenant=who.tenant, by=who.name)

        return json_response({"tenant": who.tenant, "version": await run_in_threadpool(run)})


def _bad_item(item: dict[str, Any]) -> InvalidInput | None:
    """Why a batch item may not be tried, if it may not. Its id is what makes a batch safe:
    the resolve goes through only if that id is its session's target, so it must be an
    action id; a missing one (null) would mean "no expectation" and take whatever is on top."""
    if not isinstance(item["session"], str):
        return InvalidInput("session", "must be a session name (a string)")
    action_id = item["id"]
    if not isinstance(action_id, str) or not action_id or len(action_id) > MAX_ID_CHARS:
        return InvalidInput("id", f"must be an action id (a string of 1-{MAX_ID_CHARS} "
                                  "characters)")
    return None


def _conflict(result: Result) -> bool:
    return result.is_error and ("expect_id" in result.details
                                or "revision_seen" in result.details)


def create_app(pa: PendingActions, resolve_timeout_s: float | None = None) -> Starlette:
    api = Api(pa, resolve_timeout_s)

    def route(path: str, fn: Any, **kw: Any) -> Route:
        return Route(path, errors(fn, api.outage), **kw)

    routes = [
        Route("/", errors(api.page)),
        Route("/static/{name}", errors(api.page)),
        Route("/healthz", api.healthz),
        route("/metrics", api.metrics_text),
        route("/v1/inbox", api.get_inbox),
        route("/v1/sessions/{session}/pending", api.get_pending),
        route("/v1/sessions/{session}/actions", api.stage, methods=["POST"]),
        route("/v1/sessions/{session}/resolve", api.resolve, methods=["POST"]),
        route("/v1/resolve-batch", api.resolve_batch, methods=["POST"]),
        route("/v1/policy", api.get_policy, methods=["GET"]),
        route("/v1/policy", api.put_policy, methods=["PUT"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        api.metrics.start()
        yield
        api.metrics.stop.set()
        await api.close()

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(SecurityHeaders)],
                    exception_handlers={404: _no_route, 405: _no_route})
    app.state.api = api
    return app


async def _no_route(request: Request, exc: Exception) -> Response:
    """An unknown path or method: one JSON answer, as every other failure."""
    status = getattr(exc, "status_code", 404)
    what = "no such route" if status == 404 else f"{request.method} is not allowed here"
    return json_response({"error": f"{what}: {request.method} {request.url.path}"}, status)


def operator_app(api: Api) -> Starlette:
    """The operator listener (``serve --metrics-port``): the deployment's figures, every
    tenant's series, with no token. It is meant for a port only the monitoring can reach
    (127.0.0.1 by default), never the one people and agents use."""

    async def all_metrics(request: Request) -> Response:
        body = await run_in_threadpool(api.metrics.render, None)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", errors(all_metrics)),
                             Route("/healthz", api.healthz)],
                     middleware=[Middleware(SecurityHeaders)])
