"""``pending-actions acl``: the Redis ACL rules of a least-privilege user per role.

A role's user may send the commands its code sends (declared below, each with what sends it)
and the commands of the scripts it runs (read from the scripts, so the rules cannot fall behind
them: Redis checks every command a script runs against the calling user, on 6.2 as on 7), on
the keys of its pattern only. The auth keys (``Keys.auth_prefix``) are outside the pattern of
the producer and worker users: only serve and the auth user reach tokens. What a role's user
can still do is in docs/threat-model.md: with EVAL it runs any Lua over its pattern's keys with
its commands, so a producer can still rewrite its deployment's pending actions.
``tests/test_privilege.py`` runs each role's work as its user and finds nothing refused (ACL
LOG), and each forbidden act refused."""

from __future__ import annotations

import re
from typing import Any

import click

from pending_actions.broker.keys import Keys

# the scripts each role runs (tests/test_privilege.py checks these against the calls in the
# code of each role, and that every script has a role)
# (the clients' set_policy and mark_policy too: pa.set_policy is a client method; a producer's
# user may run them, but its key pattern lets it only read the policies, so it sets none)
PRODUCER_SCRIPTS = ("stage", "reserve", "set_slot", "clear_slot", "pending", "peek",
                    "set_policy", "mark_policy", "claim_run", "save_run", "renew_run")
# (mark_policy: housekeeping raises the partitions' markers of a policy set half way)
WORKER_SCRIPTS = ("take", "begin", "unclaim", "renew", "finalize", "readd", "recover", "expire",
                  "mark_expiries", "beat", "park", "retire", "upgrade", "upgrade_stack",
                  "register", "sweep", "mark_policy", "note_outcome", "approve")
POLICY_SCRIPTS = ("set_policy", "mark_policy")
SCRIPTS: dict[str, tuple[str, ...]] = {
    "producer": PRODUCER_SCRIPTS, "worker": WORKER_SCRIPTS, "serve": PRODUCER_SCRIPTS,
    "auth": POLICY_SCRIPTS}

# The commands each role's code sends itself, by what sends them (found by running each role's
# work as a user allowed everything, with MONITOR, and by reading the paths no run takes).
# every connection: redis-py's handshake and health checks (SELECT only for a URL naming a
# database other than 0: see acl_rules)
CONNECTION = ("hello", "ping", "client|setname")
# scripts (EVAL until Redis has one, EVALSHA, SCRIPT LOAD at start), transactions, WAIT with
# REPLICA_WAIT, and the one clock (TIME)
RUNNING = ("eval", "evalsha", "script|load", "multi", "exec", "discard", "wait", "time")
# producers/ (the Python clients): look at a batch's sessions (HGET their owner records, TYPE
# of their keys), mark a session a slot was set in (HSETNX), send a resolve request (XADD) and
# wait for its reply (BLPOP), check that a live worker has the handler (ZRANGE, HGETALL; where
# none has, a ZADD that changes nothing tells a Redis that is full), read sessions, history,
# dead letters, stats (ids come from reserve.lua, a session's claim and tenant index from
# stage.lua)
CLIENT = ("type", "hsetnx", "xadd", "blpop", "get", "hget", "hgetall", "hvals", "hlen",
          "hscan", "lrange", "llen", "xrevrange", "xlen", "zrange", "zcard", "zcount", "zadd")
# the views across sessions (ls --all --tenant, dead --all --tenant, the inbox): a tenant's
# index in each partition (SSCAN) and the owner records of its members (HMGET). Not SCAN: the
# operator's --unowned views and `repair`, which SCAN, need a user of their own
VIEWS = ("sscan", "hmget")
# serve's /metrics: the event feed it counts from, and the consumers of the streams
METRICS = ("xread", "xinfo|consumers")
# workers/: the request and task streams (consumer groups; a task's dead stream, XLEN while a
# queue drains, DEL of a purged one), the webhook feed, the pool registry (ZREM at a clean
# stop; register.lua keeps it), recovery (ZRANGE of the lease and expiry indexes, MGET of their
# marks, HGET of a lease), housekeeping (its record and lock, HSCAN of the sessions hashes), the
# sweep of in-flight state (its record and lock, SCAN for the inflight hashes), beats (DEL, ZREM
# at a clean stop), the key upgrade at start (TYPE, SMEMBERS of an older index, SADD to the
# tenant indexes, the layout mark), and INFO (run id, eviction policy, version, the key count a
# sweep's pages are sized by)
WORKER = ("xgroup|create", "xreadgroup", "xautoclaim", "xack", "xdel", "xadd", "xread",
          "xrevrange", "xlen", "del", "hset", "hget", "hgetall", "hdel", "hlen", "hscan", "zadd",
          "zrem", "zrange", "zrangebyscore", "zremrangebyscore", "mget", "get", "set", "sscan",
          "scard", "srem", "sadd", "smembers", "scan", "exists", "type", "info", "hmget")
# the token store (serve/auth.py): look a token up, create, revoke (and its grant into every
# partition's revoked set: SADD), list, and the one move of an older version's keys (WATCH,
# read, MULTI/EXEC)
AUTH = ("hget", "hgetall", "hmget", "hset", "hsetnx", "hdel", "hvals", "del", "watch", "unwatch",
        "multi", "exec", "discard", "sadd")

PLAIN: dict[str, tuple[str, ...]] = {
    "producer": (*CONNECTION, *RUNNING, *CLIENT, *VIEWS),
    "worker": (*CONNECTION, *RUNNING, *WORKER),
    "serve": (*CONNECTION, *RUNNING, *CLIENT, *VIEWS, *METRICS, *AUTH),
    # and `policy set/show/test`: a policy's versions (HGET), its scripts
    "auth": (*CONNECTION, *AUTH, *RUNNING),
}
ROLES = tuple(PLAIN)


def patterns(role: str, keys: Keys, version: str = "7") -> list[str]:
    """The key patterns of ``role``: the deployment's prefix, and for serve and the auth user
    the auth prefix (for the auth user, also the older token keys it moves). The policies'
    prefix: read-only for producers and workers (Redis 7's ``%R~``; 6.2 has no read-only
    pattern, so there they may write it too: docs/threat-model.md), read-write for serve and
    the auth user, which also writes the partitions' markers of a policy's version and, as
    it revokes a token, its grant into their revoked sets."""
    ours, auth, policy = f"~{keys.prefix}:*", f"~{keys.auth_prefix}:*", \
        f"~{keys.policy_prefix}:*"
    read_policy = f"%R{policy}" if int(version.split(".")[0]) >= 7 else policy
    return {"producer": [ours, read_policy], "worker": [ours, read_policy],
            "serve": [ours, auth, policy],
            "auth": [auth, f"~{keys.legacy_token_names}", f"~{keys.legacy_tokens}", policy,
                     f"~{keys.policy_markers_pattern()}", f"~{keys.revoked_pattern()}"]}[role]


def script_commands(names: tuple[str, ...]) -> set[str]:
    """Every command the scripts ``names`` run inside Redis (the part of the prelude each uses
    included), read from their text: as sent with Redis 7's flags and without them (to 6.2,
    and by producers), where one flagged allow-oom begins with a write of its own."""
    from pending_actions.broker.scripts import source

    return {m.lower() for name in names for flags in (True, False)
            for m in re.findall(r"(?:redis\.p?call|call_on)\('([A-Za-z]+)'",
                                source(name, flags))}


def commands(role: str, select: bool = False) -> list[str]:
    return sorted({*PLAIN[role], *script_commands(SCRIPTS[role]), *(["select"] if select else [])})


def acl_rules(role: str, prefix: str = "pa", password: str = "<password>",
              select: bool = False, version: str = "7") -> list[str]:
    """The rules, in order: no command but those named, no key outside the role's patterns,
    no pub/sub. Deliberately absent: FLUSH*, KEYS, CONFIG, DEBUG, CLIENT KILL, MONITOR,
    SHUTDOWN and every other @dangerous command but INFO (workers read the run id and the
    eviction policy). For Redis 7 (``version``) the policies are read-only to producers and
    workers (``%R~``); 6.2 reads no such pattern, and its rules grant them as any key.

    ``select``: the deployment's database is not 0, so its clients send SELECT. Key patterns
    hold in every database alike, so a user with SELECT reaches its prefix in all of them: it
    is granted only where needed, and deployments on one Redis stay apart by KEY_PREFIX."""
    keys = Keys(prefix)
    return ["on", f">{password}", "resetkeys", *patterns(role, keys, version), "resetchannels",
            "-@all",
            *(f"+{c}" for c in commands(role, select))]


@click.command()
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--user", help="User name [default: pa-ROLE].")
@click.option("--password", default="<password>", show_default=True)
@click.option("--redis-version", type=click.Choice(["7", "6.2"]),
              help="The server the rules are for [default: asked of --redis-url's server, "
                   "else 7]: 6.2 has no read-only key pattern.")
@click.pass_obj
def acl(obj: Any, role: str, user: str | None, password: str,
        redis_version: str | None) -> None:
    """Print the Redis ACL SETUSER command for a least-privilege user of ROLE: a producer
    (an agent runtime staging and resolving, `mcp` over stdio; the operators' views), a worker
    (`pending-actions worker`), serve (the HTTP API, and `mcp --transport http`: they check
    tokens), or auth (whoever runs `pending-actions token`: the token store only). Producer
    and worker reach no token. SELECT is granted only when --redis-url names a database other
    than 0."""
    from pending_actions.broker.urls import url_options

    name = user or f"pa-{role}"
    settings = obj.settings()
    select = bool(settings.redis_url and url_options(settings.redis_url).options.get("db"))
    rules = acl_rules(role, settings.key_prefix, password, select,
                      redis_version or _server_version(settings.redis_url))
    obj.out({"user": name, "rules": rules},
            " ".join(_quoted(w) for w in ("ACL", "SETUSER", name, *rules)))


def _server_version(url: str | None) -> str:
    """The major version of the server at ``url`` ("7" when there is none to ask, or it does
    not answer: said on stderr)."""
    if not url:
        return "7"
    from pending_actions.broker.connection import producer_client, server_info

    try:
        info = server_info(producer_client(url), "server")
        found = [info] if "redis_version" in info else list(info.values())
        return "6.2" if min(int(str(i["redis_version"]).split(".")[0]) for i in found) < 7 \
            else "7"
    except Exception as exc:  # any failure to ask: the default, said
        click.echo(f"note: could not ask {url.split('@')[-1]} its version ({type(exc).__name__});"
                   " rules for Redis 7 (--redis-version 6.2 for 6.2)", err=True)
        return "7"


def _quoted(word: str) -> str:
    """``word`` as redis-cli reads it from a line (the line can be piped to it): quoted when
    it holds a space or a quote, say in a password."""
    if not any(c.isspace() or c in "\"'\\" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
