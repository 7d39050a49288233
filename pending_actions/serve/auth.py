"""Bearer tokens for people and programs that talk to ``serve``.

A token is 32 random bytes; Redis keeps only its SHA-256 (a token has far more entropy than a
password, so a slow hash would add nothing but latency to every request), with the name, tenant
and role it was created for. Revoking deletes the record, so the next request with it is a 401.

The records live under the auth prefix (``Keys.tokens``), which only serve's Redis user and the
one that runs ``pending-actions token`` reach (``pending-actions acl``).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import orjson
import redis

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import check_tenant, person

log = logging.getLogger("pending_actions.serve")

Role = Literal["producer", "approver", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
TOKEN_PREFIX = "pat_"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def grant_of(hashed: str) -> str:
    """A token's grant id: what its approvals carry and its revocation names (the partitions'
    revoked sets, ``Keys.revoked``). The head of its digest: a hash of a hash of 32 random
    bytes, which tells nothing of the token, and a token made before grants has one too."""
    return hashed[:16]


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for; ``grant``: its grant id (``grant_of``)."""

    name: str
    tenant: str
    role: Role
    created_at: float
    grant: str = ""

    def may(self, *roles: Role) -> bool:
        return self.role == "admin" or self.role in roles


class Tokens:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def create(self, tenant: str, role: str, name: str | None = None) -> tuple[str, Principal]:
        """Returns the token (shown once, never stored) and what it grants."""
        check_tenant(tenant)
        if role not in ROLES:
            raise InvalidInput("role", f"must be one of {', '.join(ROLES)} (got {role!r})")
        # a person's name, as approvals compare it: Alice and alice are one token name
        name = person("name", f"{tenant}-{role}-{secrets.token_hex(3)}" if name is None
                      else name)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        hashed = digest(token)
        principal = Principal(name, tenant, role, time.time(), grant_of(hashed))
        # the name is claimed first: a crash before the second write leaves a name without a
        # token, which `token revoke NAME` clears; never a token without a revocable name
        if not self.client.hsetnx(self.keys.token_names, name, hashed):
            raise InvalidInput("name", f"a token named {name!r} exists; revoke it first")
        record = {k: v for k, v in asdict(principal).items() if k != "grant"}
        self.client.hset(self.keys.tokens, hashed, orjson.dumps(record))
        return token, principal

    def first(self, tenant: str) -> tuple[str | None, str]:
        """A deployment's first way in: an admin token of ``tenant``, made by the first call
        only (the first start of ``serve --first-token``). Returns the token (None on every
        later call) and its name. The mark is claimed before the token is made: a crash in
        between leaves no first token, never two (``token create`` makes more)."""
        check_tenant(tenant)
        name = person("name", f"{tenant}-admin-{secrets.token_hex(3)}")
        if not self.client.hsetnx(self.keys.first_token, "made", name):
            made: Any = self.client.hget(self.keys.first_token, "made")
            return None, made.decode() if isinstance(made, bytes) else str(made)
        return self.create(tenant, "admin", name)[0], name

    def lookup(self, token: str) -> Principal | None:
        if not token.startswith(TOKEN_PREFIX):
            return None
        hashed = digest(token)
        raw: Any = self.client.hget(self.keys.tokens, hashed)
        if raw is None:
            return None
        return _principal(raw, hashed)

    def revoke(self, name: str) -> bool:
        """The token of ``name`` stops working, and the approvals it gave stop counting: its
        grant goes into every partition's revoked set first (a crash between the two steps
        leaves a token whose approvals count for nothing: revoke it again)."""
        # a name as people are compared; a token made before names were folded keeps its own
        found: Any = None
        for candidate in dict.fromkeys((person("name", name), name)):
            found = self.client.hget(self.keys.token_names, candidate)
            if found is not None:
                name = candidate
                break
        if found is None:
            return False
        hashed = found.decode() if isinstance(found, bytes) else str(found)
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for p in range(k.partitions):
            pipe.sadd(k.revoked(p), grant_of(hashed))
        pipe.execute()
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(k.tokens, hashed)
        pipe.hdel(k.token_names, name)
        pipe.execute()
        return True

    def all(self) -> list[Principal]:
        records: Any = self.client.hgetall(self.keys.tokens)
        return sorted((_principal(v, h.decode()) for h, v in records.items()),
                      key=lambda p: p.name)


def _principal(raw: bytes, hashed: str) -> Principal:
    fields = orjson.loads(raw)
    fields.pop("grant", None)
    return Principal(**fields, grant=grant_of(hashed))
