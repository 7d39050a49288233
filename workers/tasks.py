"""The dramatiq side of a process that sends or runs handler tasks: the task message and the
broker chosen by URL."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import orjson
from pydantic import BaseModel, ConfigDict

from pending_actions.broker.connection import worker_client
from pending_actions.broker.context import Context
from pending_actions.broker.models import ResolveAction, ResolveRequest
from pending_actions.workers.taskbroker import OrjsonEncoder, StreamsBroker

ACTOR_NAME = "run_attempt"


def pool_queue(queue: str, pool: str) -> str:
    """The dramatiq queue of a pool's tasks on our streams broker in a Redis of its own
    (``DRAMATIQ_URL``): one per pool, no partitions."""
    return f"{queue}.{pool}"


class TaskMessage(BaseModel):
    """The keyword arguments of the ``run_attempt`` task: one attempt of one resolve, named by
    the token of its lease. Sent by the resolve worker, read by the actor."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # a newer sender's fields: ignored

    session: str
    token: str
    req: str
    action: ResolveAction
    reason: str
    extra: dict[str, Any] | None = None
    edit: dict[str, Any] | None = None  # the resolver's JSON Merge Patch for the payload

    @classmethod
    def for_lease(cls, request: ResolveRequest, token: str) -> TaskMessage:
        return cls(session=request.session, token=token, req=request.req,
                   action=request.action, reason=request.reason, extra=request.extra,
                   edit=request.edit)

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> TaskMessage:
        """Raises pydantic's ValidationError for a malformed message."""
        return cls.model_validate(kwargs)

    def to_message(self, queue: str) -> dramatiq.Message[Any]:
        return dramatiq.Message(queue_name=queue, actor_name=ACTOR_NAME, args=(),
                                kwargs=self.model_dump(), options={})


def encoded_task(request: ResolveRequest, token: str, queue: str, message_id: str) -> bytes:
    """``TaskMessage.for_lease(request, token).to_message(queue)`` as our streams broker
    stores it (``OrjsonEncoder``), built straight from the request, which was validated when
    it was read: the resolve worker builds one per take, and the models and dramatiq's
    dataclass cost it more than the rest of the take's Python. Same fields in the same order
    (``tests/test_input.py`` compares the two)."""
    return orjson.dumps({
        "queue_name": queue, "actor_name": ACTOR_NAME, "args": (),
        "kwargs": {"session": request.session, "token": token, "req": request.req,
                   "action": request.action, "reason": request.reason,
                   "extra": request.extra, "edit": request.edit},
        "options": {}, "message_id": message_id,
        "message_timestamp": int(time.time() * 1000)})


def task_broker(ctx: Context) -> StreamsBroker:
    """Our push-driven Redis streams broker: in the state's Redis, or in the Redis of
    ``DRAMATIQ_URL``; a URL of any other kind is a ``ConfigError`` (there is no RabbitMQ task
    broker: docs/benchmarks.md says why)."""
    dramatiq.set_encoder(OrjsonEncoder())
    url = ctx.settings.dramatiq_url or ctx.settings.require_url()
    client = ctx.client if url == ctx.settings.redis_url else worker_client(url)
    return StreamsBroker(client, ctx.keys, claim_idle_ms=ctx.settings.claim_idle_ms)
