"""What every process builds first: settings, key names, a Redis client, the scripts, and (for
processes that send or run handler tasks) the dramatiq broker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dramatiq
import redis

from broker.connection import producer_client, worker_client
from broker.keys import Keys
from broker.scripts import Scripts
from broker.settings import Settings
from broker.taskbroker import OrjsonEncoder, StreamsBroker

ACTOR_NAME = "run_attempt"


@dataclass
class Context:
    settings: Settings
    keys: Keys
    client: redis.Redis
    scripts: Scripts

    @classmethod
    def create(cls, settings: Settings, *, role: str = "producer") -> Context:
        url = settings.require_url()
        client = worker_client(url) if role == "worker" else producer_client(url)
        keys = Keys(settings.key_prefix)
        return cls(settings, keys, client, Scripts(client, settings, keys))


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
