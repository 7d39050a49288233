"""What every route of ``serve`` shares: reading a JSON body within the limits, one JSON error
shape for every failure, the security headers on every response, and one log line per Redis
outage instead of one per request.

Status codes: 400 bad input (``{"error", "field"}``), 401 no or bad token, 403 a role that may
not (or a stage the tenant's policy denied: ``{"error", "rule", "reason"}``), 404 no such
session (another tenant's answers the same), 408 a body slower than
``SERVE_BODY_TIMEOUT_S`` (answered by ``listen.Deadlines``), 413 a body over
``broker.payloads.max_body_bytes``, 503 Redis unavailable or full, 500 anything else (logged
once, with its traceback: that one is a bug).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pending_actions.broker.errors import (
    Denied,
    Forbidden,
    InvalidInput,
    PendingActionsError,
    RedisFull,
    RedisUnavailable,
)
from pending_actions.broker.failures import REDIS_ERRORS, translate
from pending_actions.broker.payloads import check_depth, max_body_bytes
from pending_actions.broker.settings import Settings

log = logging.getLogger("pending_actions.serve")
# a 503: Redis away or full, as this package says it or as redis-py raised it
UNAVAILABLE: tuple[type[Exception], ...] = (RedisUnavailable, RedisFull, *REDIS_ERRORS)
Handler = Callable[[Request], Awaitable[Response]]

# The inbox page loads its script and style from /static and talks only to this origin; no
# inline script or style, no frames (clickjacking an approve button), no referrer (a session id
# in a URL stays here)
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
     b"img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class HTTPError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


def json_response(value: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json",
                    headers=headers)


class Outage:
    """Redis going away is logged once, as one warning line, and its return once; never a
    traceback per request (or per scrape) while it is away."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.down = False
        self.lock = threading.Lock()

    def failed(self, exc: BaseException) -> None:
        with self.lock:
            if self.down:
                return
            self.down = True
        log.warning("%s: Redis unavailable (%s); answering 503 until it is back", self.what,
                    exc)

    def ok(self) -> None:
        if not self.down:  # the common case: no lock
            return
        with self.lock:
            if not self.down:
                return
            self.down = False
        log.warning("%s: Redis is back", self.what)


async def read_json(request: Request, settings: Settings,
                    kinds: type | tuple[type, ...] = dict) -> Any:
    """The request's JSON body: refused (413) past ``max_body_bytes`` before it is read in
    full, then parsed, then every field held to the nesting limit of the client's own checks
    (``broker.payloads``), so a deep value is a 400 naming its field, never a parser's
    recursion."""
    limit = max_body_bytes(settings)
    length = request.headers.get("content-length")
    # ASCII digits only, and never int() of more than fit in a length: a header of thousands
    # of digits would raise past int()'s digit limit (a 500)
    if length is not None and (not (length.isascii() and length.isdigit())
                               or len(length) > 18 or int(length) > limit):
        raise HTTPError(413, f"the body is over the limit of {limit} bytes", "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, f"the body is over the limit of {limit} bytes", "body")
        chunks.append(chunk)
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise InvalidInput("body", f"not JSON: {exc}") from None
    if not isinstance(body, kinds):
        raise InvalidInput("body", "must be a JSON object")
    for field, value in _fields(body):
        check_depth(value, field)
    return body


def _fields(body: Any) -> Iterator[tuple[str, Any]]:
    """Each input field of a body with its name as errors give it: ``extra``, or in a batch
    ``items.3.extra``."""
    items = body.get("items") if isinstance(body, dict) else body
    if isinstance(body, dict):
        yield from ((k, v) for k, v in body.items() if k != "items" or not isinstance(v, list))
    if isinstance(items, list):
        for n, item in enumerate(items):
            if isinstance(item, dict):
                yield from ((f"items.{n}.{k}", v) for k, v in item.items())
            else:
                yield f"items.{n}", item


def errors(fn: Handler, outage: Outage | None = None) -> Handler:
    """Every failure of a route as one JSON answer; Redis errors as 503 whatever raised them
    (the token lookup included), noted in ``outage`` (a route that reads Redis has one)."""

    async def wrapped(request: Request) -> Response:
        try:
            response = await fn(request)
        except HTTPError as exc:
            headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
            body = {"error": str(exc)} if exc.field is None else \
                {"error": str(exc), "field": exc.field}
            return json_response(body, exc.status, headers)
        except InvalidInput as exc:
            return json_response({"error": str(exc), "field": exc.field}, 400)
        except UNAVAILABLE as exc:
            err = translate(exc)
            if outage is not None:
                outage.failed(err)
            return json_response({"error": str(err)}, 503, {"retry-after": "1"})
        except Denied as exc:  # a stage the tenant's policy refused (recorded as denied)
            return json_response({"error": str(exc), "rule": exc.rule, "reason": exc.reason,
                                  "denied": exc.denied}, 403)
        except Forbidden as exc:
            if isinstance(exc.__cause__, REDIS_ERRORS):  # Redis refused serve's own user
                log.error("Redis refused serve: %s", exc)
                return json_response({"error": str(exc)}, 503)
            # another tenant's session: the same answer as none at all
            return json_response({"error": "no such session"}, 404)
        except PendingActionsError as exc:
            return json_response({"error": str(exc)}, 500)
        except ClientDisconnect:
            # no one to answer: the client left mid-body, or its body came too slowly and the
            # connection has had its 408 already (listen.Deadlines); never a traceback
            return json_response({"error": "the client went away"}, 400)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return json_response({"error": "internal error (logged by the server)"}, 500)
        if outage is not None:
            outage.ok()
        return response

    return wrapped


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` on every response, the page's and the API's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
