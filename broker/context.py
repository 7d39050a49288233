"""What every process builds first: settings, key names, a Redis client and the scripts. The
dramatiq side (``workers/tasks.py``) lives with the workers, so that producers never import
dramatiq."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from pending_actions.broker.atomic.scripts import Scripts
from pending_actions.broker.clock import RedisClock
from pending_actions.broker.connection import producer_client, worker_client
from pending_actions.broker.failures import redis_errors
from pending_actions.broker.keys import Keys
from pending_actions.broker.settings import Settings


@dataclass
class Context:
    settings: Settings
    keys: Keys
    client: redis.Redis
    scripts: Scripts
    clock: RedisClock = field(init=False)

    def __post_init__(self) -> None:
        self.clock = RedisClock(self.client)

    @classmethod
    def create(cls, settings: Settings, *, role: str = "producer") -> Context:
        url = settings.require_url()
        worker = role == "worker"
        # a cluster client reads the slot table as it is made, and raises what it met then (no
        # node answered, slots left unserved) as redis-py's own errors
        with redis_errors(url):
            # a worker's threads each keep a connection, and claim on more: room for them all
            room = max(64, 16 + 2 * (settings.worker_threads + settings.resolve_threads))
            client = worker_client(url, room) if worker else producer_client(url)
        keys = Keys(settings.key_prefix, settings.partitions)
        # workers send the Redis 7 script flags when the server reads them (asked on first use)
        scripts = Scripts(client, settings, keys, None if worker else False)
        return cls(settings, keys, client, scripts)

