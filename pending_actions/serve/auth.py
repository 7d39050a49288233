"""Bearer tokens for people and programs that talk to ``serve``.

A token is 32 random bytes; Redis keeps only its SHA-256 (a token has far more entropy than a
password, so a slow hash would add nothing but latency to every request), with the name, tenant
and role it was created for. Revoking deletes the record, so the next request with it is a 401.

The records live under the auth prefix (``Keys.tokens``), which only serve's Redis user and the
one that runs ``pending-actions token`` reach (``pending-actions acl``). Versions before it kept
them under the prefix every role's user reaches: the first use of ``Tokens`` moves them, in one
atomic step (``move_legacy``), so tokens made before an upgrade keep working.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson
import redis

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import check_tenant

log = logging.getLogger("pending_actions.serve")

Role = Literal["producer", "approver", "admin"]
ROLES: tuple[Role, ...] = ("producer", "approver", "admin")
TOKEN_NAME_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
TOKEN_PREFIX = "pat_"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for."""

    name: str
    tenant: str
    role: Role
    created_at: float

    def may(self, *roles: Role) -> bool:
        return self.role == "admin" or self.role in roles


class Tokens:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.moved = False  # the older keys looked at (and moved) by this object

    def move_legacy(self) -> int:
        """Move the tokens an older version kept (``Keys.legacy_token_names`` and
        ``legacy_tokens``) to the auth keys, in one transaction (the four keys share the
        ``{tokens}`` tag, one cluster slot), and delete the older keys. A name the auth keys
        already have keeps its token there; the older one of that name goes, and so does a
        record no name points to (it could not be revoked). Returns how many moved."""
        k = self.keys
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    # and the names: a `token create` meanwhile must not lose its name
                    pipe.watch(  # type: ignore[no-untyped-call]
                        k.legacy_token_names, k.legacy_tokens, k.token_names)
                    names: Any = pipe.hgetall(k.legacy_token_names)
                    records: Any = pipe.hgetall(k.legacy_tokens)
                    if not names and not records:
                        pipe.unwatch()
                        return 0
                    ours: Any = pipe.hmget(k.token_names, list(names)) if names else []
                    pipe.multi()
                    moved = 0
                    for (name, hashed), taken in zip(names.items(), ours, strict=True):
                        if taken is None and hashed in records:
                            pipe.hset(k.token_names, name, hashed)
                            pipe.hset(k.tokens, hashed, records[hashed])
                            moved += 1
                    pipe.delete(k.legacy_token_names, k.legacy_tokens)
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue  # written meanwhile: read them again
        log.warning("moved %d token(s) of an older version from %s to %s, dropped %d (a name "
                    "taken there, or no name); list them with `pending-actions token ls`: every "
                    "Redis user could write the older keys", moved, k.legacy_tokens, k.tokens,
                    len(records) - moved)
        return moved

    def _ready(self) -> None:
        if not self.moved:
            self.move_legacy()
            self.moved = True

    def create(self, tenant: str, role: str, name: str | None = None) -> tuple[str, Principal]:
        """Returns the token (shown once, never stored) and what it grants."""
        check_tenant(tenant)
        if role not in ROLES:
            raise InvalidInput("role", f"must be one of {', '.join(ROLES)} (got {role!r})")
        if name is None:
            name = f"{tenant}-{role}-{secrets.token_hex(3)}"
        if not TOKEN_NAME_RE.match(name):
            raise InvalidInput("name", f"must be 1-128 characters of A-Z a-z 0-9 . _ : @ - "
                                       f"(got {name!r})")
        self._ready()
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        principal = Principal(name, tenant, role, time.time())
        hashed = digest(token)
        # the name is claimed first: a crash before the second write leaves a name without a
        # token, which `token revoke NAME` clears; never a token without a revocable name
        if not self.client.hsetnx(self.keys.token_names, name, hashed):
            raise InvalidInput("name", f"a token named {name!r} exists; revoke it first")
        self.client.hset(self.keys.tokens, hashed, orjson.dumps(asdict(principal)))
        return token, principal

    def lookup(self, token: str) -> Principal | None:
        if not token.startswith(TOKEN_PREFIX):
            return None
        self._ready()
        raw: Any = self.client.hget(self.keys.tokens, digest(token))
        if raw is None:
            return None
        return Principal(**orjson.loads(raw))

    def revoke(self, name: str) -> bool:
        self._ready()
        hashed: Any = self.client.hget(self.keys.token_names, name)
        if hashed is None:
            return False
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.keys.tokens, hashed)
        pipe.hdel(self.keys.token_names, name)
        pipe.execute()
        return True

    def all(self) -> list[Principal]:
        self._ready()
        values: Any = self.client.hvals(self.keys.tokens)
        return sorted((Principal(**orjson.loads(v)) for v in values), key=lambda p: p.name)
