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


def check_topology(client: Any, url: str) -> None:
    """ConfigError for a single-node client (a plain URL) of a Redis Cluster node: its first
    key of another node's slot would answer MOVED, deep in a loop that restarts for ever."""
    from pending_actions.broker.connection import is_cluster, server_info
    from pending_actions.broker.failures import cluster_node

    if not is_cluster(client) and \
            str(server_info(client, "cluster").get("cluster_enabled", 0)) == "1":
        raise cluster_node(url)


def preflight(ctx: Any) -> None:
    """At a worker's start: log in, read INFO (a cluster node under a plain URL, the eviction
    policy), load the scripts, read the clock; reach the Redis of ``DRAMATIQ_URL`` too, when
    it is another. Raises the package's errors (Forbidden for credentials or a missing
    permission, ConfigError for a policy or a cluster node, RedisUnavailable for no Redis) so
    that the worker exits at once with one clear line instead of retrying for ever."""
    from pending_actions.broker.connection import producer_client, server_info
    from pending_actions.broker.failures import redis_errors

    url = ctx.settings.redis_url or ""
    with redis_errors(url):
        ctx.client.ping()
        check_topology(ctx.client, url)
        check_policy(server_info(ctx.client, "memory"))
        ctx.scripts.load_all()
        ctx.clock.sync()
    tasks = ctx.settings.dramatiq_url
    if tasks and tasks != url:
        other: Any = producer_client(tasks)
        try:
            with redis_errors(tasks):
                other.ping()
                check_topology(other, tasks)
        finally:
            other.close()
