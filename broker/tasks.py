"""The dramatiq side of a process that sends or runs handler tasks: the broker chosen by URL."""

from __future__ import annotations

from typing import Any

import dramatiq

from pending_actions.broker.connection import worker_client
from pending_actions.broker.context import Context
from pending_actions.broker.taskbroker import OrjsonEncoder, StreamsBroker

ACTOR_NAME = "run_attempt"


def task_broker(ctx: Context) -> Any:
    """The dramatiq broker chosen by URL: our push-driven Redis streams broker by default,
    dramatiq's RabbitMQ broker for an ``amqp://`` URL."""
    dramatiq.set_encoder(OrjsonEncoder())
    url = ctx.settings.dramatiq_url or ctx.settings.require_url()
    if url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url)
    client = ctx.client if url == ctx.settings.redis_url else worker_client(url)
    return StreamsBroker(client, ctx.keys, claim_idle_ms=ctx.settings.claim_idle_ms)
