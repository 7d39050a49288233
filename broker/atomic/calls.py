"""A script call, ready to send: ``run()`` sends it now with EVALSHA (redis-py's
``register_script`` handles the NOSCRIPT fallback); ``on(pipe)`` queues it on a pipeline and
returns a ``Queued`` that picks and decodes its reply from ``pipe.execute()``. On a pipeline the
script goes as EVAL with its body (redis-py's pipeline would send SCRIPT EXISTS before every
execute that carries a registered script: a round trip more), or with ``by_digest=True`` as
EVALSHA, where the caller sends again whatever comes back NOSCRIPT (the hot path and stage
batches: Redis hashes an EVAL's body at every call). ``broker/atomic/scripts.py`` builds them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import redis
import redis.asyncio
from redis.exceptions import SlotNotCoveredError

from pending_actions.broker.connection import is_cluster

R = TypeVar("R")


@dataclass(frozen=True)
class Queued(Generic[R]):
    """Where a script's reply will be in the list ``pipe.execute()`` returns."""

    index: int
    decode: Callable[[Any], R]

    def get(self, replies: list[Any]) -> R:
        return self.decode(replies[self.index])


# not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, which
# costs three times as long (~0.35 us more), and every script call builds one
@dataclass(slots=True)
class Call(Generic[R]):
    script: Any  # redis-py's registered Script
    keys: Sequence[str]
    args: Sequence[Any]
    decode: Callable[[Any], R]

    def run(self) -> R:
        return self.decode(self.script(keys=self.keys, args=self.args))

    async def run_async(self) -> R:
        """``run()`` on Scripts built over a ``redis.asyncio`` client."""
        return self.decode(await self.script(keys=self.keys, args=self.args))

    def on(self, pipe: redis.client.Pipeline | redis.asyncio.client.Pipeline,
           by_digest: bool = False) -> Queued[R]:
        """Queue the script on ``pipe`` with its body (EVAL), or with ``by_digest`` its SHA1
        (EVALSHA): a pipeline of many calls is then mostly their arguments, not the body over
        and over (3 KB for stage.lua). Redis answers NOSCRIPT while its script
        cache lacks the script (after a restart, a failover, SCRIPT FLUSH): the caller sends
        those calls again with their body, which also loads it."""
        index = len(pipe)
        # execute_command, not eval(): redis-py's cluster pipeline refuses eval() itself but
        # routes an EVAL by its keys like any command. It would first ask a server for those
        # keys (COMMAND GETKEYS, a round trip per call): it is told their node instead, and
        # finds it again by itself after a MOVED
        to: dict[str, Any] = {}
        if is_cluster(pipe) and self.keys:  # redis-py's cluster pipeline
            # a slot its table lacks (mid-failover): left to redis-py, which reads it again
            with contextlib.suppress(SlotNotCoveredError):
                to["target_nodes"] = cast(Any, pipe).get_node_from_key(self.keys[0])
        if by_digest:
            pipe.execute_command(
                "EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args, **to)
        else:
            pipe.execute_command(
                "EVAL", self.script.script, len(self.keys), *self.keys, *self.args, **to)
        return Queued(index, self.decode)
