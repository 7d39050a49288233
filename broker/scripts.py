"""The atomic operations: one Lua file each under ``scripts/``, registered with redis-py's
``register_script`` (which handles EVALSHA and the NOSCRIPT fallback). Each method passes every
key it touches in KEYS, all under the session's hash tag.

A script queued on a pipeline is sent as EVAL with its body instead: redis-py's pipeline sends
SCRIPT EXISTS before every execute that carries a registered script, one more round trip on
each step of a resolve, while EVAL of a body Redis has seen costs it only a SHA1 of ~1 KB."""

from __future__ import annotations

from importlib import resources
from typing import Any

import redis

from pending_actions.broker.keys import Keys
from pending_actions.broker.settings import Settings

_NAMES = (
    "stage", "set_slot", "clear_slot", "take", "begin", "renew", "finalize", "readd", "recover",
    "pending", "peek",
)


def _source(name: str) -> str:
    return (resources.files("pending_actions.broker") / "scripts" / f"{name}.lua").read_text()


class Scripts:
    def __init__(self, client: redis.Redis, settings: Settings, keys: Keys) -> None:
        self._k = keys
        self._s = settings
        self._src = {name: _source(name) for name in _NAMES}
        self._fn = {name: client.register_script(src) for name, src in self._src.items()}

    def _run(self, name: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        if isinstance(client, redis.client.Pipeline):
            return client.eval(self._src[name], len(keys), *keys, *args)
        return self._fn[name](keys=keys, args=args, client=client)

    # --- producers -------------------------------------------------------------------------
    def stage(self, session: str, action_id: str, spec: bytes, client: Any = None) -> Any:
        k = self._k
        return self._run(
            "stage",
            [k.stack(session), k.actions(session), k.history(session)],
            [action_id, spec, self._s.history_maxlen],
            client,
        )

    def set_slot(self, session: str, slot: str, action_id: str, spec: bytes) -> Any:
        k = self._k
        key = k.directive(session) if slot == "directive" else k.standing(session)
        return self._run(
            "set_slot",
            [key, k.actions(session), k.state(session), k.history(session)],
            [action_id, spec, f"{slot}-set", self._s.history_maxlen],
        )

    def clear_slot(self, session: str, slot: str) -> Any:
        k = self._k
        key = k.directive(session) if slot == "directive" else k.standing(session)
        return self._run(
            "clear_slot",
            [key, k.actions(session), k.state(session), k.history(session)],
            [f"{slot}-cleared", self._s.history_maxlen],
        )

    def pending(self, session: str, limit: int) -> list[bytes]:
        k = self._k
        out: list[bytes] = self._run(
            "pending",
            [k.stack(session), k.inflight(session), k.actions(session), k.state(session)],
            [limit],
        )
        return out

    def peek(self, session: str) -> list[bytes]:
        k = self._k
        out: list[bytes] = self._run(
            "peek", [k.directive(session), k.stack(session), k.actions(session)], []
        )
        return out

    # --- resolve worker --------------------------------------------------------------------
    def take(self, session: str, req: str, action: str, token: str, reason: str,
             extra: bytes, marker_ttl_s: int, none_reply: bytes,
             client: Any = None) -> list[bytes]:
        k = self._k
        out: list[bytes] = self._run(
            "take",
            [k.directive(session), k.stack(session), k.standing(session), k.actions(session),
             k.state(session), k.inflight(session), k.history(session),
             k.request_marker(session, req), k.reply(session, req)],
            [req, action, token, self._s.dispatch_timeout_ms, marker_ttl_s,
             self._s.history_maxlen, reason, extra, none_reply, self._s.reply_ttl_s],
            client,
        )
        return out

    def recover(self, session: str, token: str, req: str, returned: bytes, dead: bytes,
                unstarted: bytes) -> tuple[int, int]:
        k = self._k
        outcome, deadline = self._run(
            "recover",
            [k.inflight(session), k.stack(session), k.directive(session), k.actions(session),
             k.state(session), k.history(session), k.dead(session), k.reply(session, req)],
            [token, self._s.max_stalls, self._s.reply_ttl_s, self._s.history_maxlen,
             returned, dead, unstarted],
        )
        return int(outcome), int(deadline)

    # --- handler tasks ---------------------------------------------------------------------
    def begin(self, session: str, token: str, client: Any = None) -> list[bytes]:
        k = self._k
        out: list[bytes] = self._run(
            "begin", [k.inflight(session), k.actions(session), k.state(session)],
            [token, self._s.lease_ms], client,
        )
        return out

    def renew(self, session: str, token: str, client: Any = None) -> Any:
        return self._run("renew", [self._k.inflight(session)], [token, self._s.lease_ms], client)

    def finalize(self, session: str, token: str, req: str, reply: bytes, event: str,
                 action_id: str, attempt: int, client: Any = None) -> Any:
        k = self._k
        return self._run(
            "finalize",
            [k.inflight(session), k.actions(session), k.state(session), k.history(session),
             k.reply(session, req)],
            [token, reply, self._s.reply_ttl_s, self._s.history_maxlen, event, action_id,
             attempt],
            client,
        )

    def readd(self, session: str, token: str, req: str, error: str, reply: bytes,
              action_id: str, attempt: int, client: Any = None) -> Any:
        k = self._k
        return self._run(
            "readd",
            [k.inflight(session), k.stack(session), k.directive(session), k.actions(session),
             k.state(session), k.history(session), k.reply(session, req)],
            [token, error, reply, self._s.reply_ttl_s, self._s.history_maxlen, action_id,
             attempt],
            client,
        )
