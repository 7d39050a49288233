"""Redis replies narrowed to what the tests' clients really get (RESP2, bytes, no decoding):
redis-py types each reply as the union over both protocols and both decodings. Each check
here is also an assertion on the reply."""

from __future__ import annotations

from collections.abc import Mapping

import redis
from redis.typing import EncodableT, FieldT

Fields = dict[bytes, bytes]
Entry = tuple[bytes, Fields]


def byte_list(reply: object) -> list[bytes]:
    assert isinstance(reply, list) and all(isinstance(x, bytes) for x in reply), reply
    return reply


def fields(reply: object) -> Fields:
    assert isinstance(reply, dict), reply
    out: Fields = {}
    for k, v in reply.items():
        assert isinstance(k, bytes) and isinstance(v, bytes), (k, v)
        out[k] = v
    return out


def entries(reply: object) -> list[Entry]:
    """An XRANGE / XREVRANGE reply."""
    assert isinstance(reply, list), reply
    out: list[Entry] = []
    for entry_id, raw in reply:
        assert isinstance(entry_id, bytes), entry_id
        out.append((entry_id, fields(raw)))
    return out


def tail_id(rc: redis.Redis, stream: str) -> bytes:
    """The id of the stream's last entry (0-0 if empty): read after it to see only news."""
    last = entries(rc.xrevrange(stream, count=1))
    return last[0][0] if last else b"0-0"


def read(rc: redis.Redis, stream: str, since: bytes, block_ms: int) -> list[Entry]:
    """XREAD of one stream: the entries after ``since``, waiting up to ``block_ms`` for one."""
    reply = rc.xread({stream: since}, block=block_ms)
    if reply is None:  # nothing came
        return []
    assert isinstance(reply, list), reply
    out: list[Entry] = []
    for _name, got in reply:
        out.extend(entries(got))
    return out


def xadd(rc: redis.Redis, stream: str, raw: Mapping[bytes, bytes]) -> bytes:
    """Write an entry as a test forges it (any bytes); its id."""
    entry: dict[FieldT, EncodableT] = dict(raw.items())
    entry_id = rc.xadd(stream, entry)
    assert isinstance(entry_id, bytes), entry_id
    return entry_id


def command_calls(client: redis.Redis) -> dict[str, int]:
    """How many times each command ran since the last CONFIG RESETSTAT (``INFO commandstats``,
    by lower-case name)."""
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in client.info("commandstats").items()}
