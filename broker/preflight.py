"""What a worker checks about its Redis before it serves, and again now and then: that it can
log in, has the permissions its role needs, and that Redis will never evict our keys.

Only ``noeviction`` is safe. Under it a full Redis refuses writes (``RedisFull``), which every
loop waits out, and nothing already stored goes. Every other policy drops keys without a word:
``allkeys-*`` any key at all (a spec, a stack, the id counter: actions lost, ids handed out
twice); ``volatile-*`` the keys with a ttl, among them the request markers that stop a
redelivered resolve from taking a second action, and the replies a resolver waits for."""

from __future__ import annotations

from typing import Any

from pending_actions.broker.errors import ConfigError

SAFE_POLICIES = frozenset({"noeviction"})


def check_policy(info: dict[str, Any]) -> None:
    """Raise ConfigError unless ``INFO``'s ``maxmemory_policy`` is safe; on a cluster, where
    INFO answers per node, on every node."""
    if "maxmemory_policy" not in info and all(isinstance(v, dict) for v in info.values()):
        for node in info.values():
            check_policy(node)
        return
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy not in SAFE_POLICIES:
        raise ConfigError(
            f"Redis maxmemory-policy is {policy}: it can evict this service's keys (lost "
            "actions, ids handed out twice, resolves taken twice). Set it to noeviction "
            "(CONFIG SET maxmemory-policy noeviction, and in redis.conf)")


def preflight(ctx: Any) -> None:
    """At a worker's start: log in, read INFO (run id, eviction policy), load the scripts,
    read the clock. Raises the package's errors (Forbidden for credentials or a missing
    permission, ConfigError for a policy, RedisUnavailable for no Redis) so that the worker
    exits at once with one clear line instead of retrying for ever."""
    from pending_actions.broker.connection import server_info
    from pending_actions.broker.failures import redis_errors

    with redis_errors(ctx.settings.redis_url or ""):
        ctx.client.ping()
        check_policy(server_info(ctx.client, "memory"))
        ctx.scripts.load_all()
        ctx.clock.sync()
