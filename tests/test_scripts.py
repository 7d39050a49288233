"""The Lua side of the protocol: every script names events and reply codes through the tables
the prelude generates from the Python enums, its header lists exactly the KEYS and ARGV it
uses, and each one, prelude included, loads in a real Redis."""

from __future__ import annotations

import re
import uuid

import pytest
import redis

from pending_actions.broker import Keys
from pending_actions.broker.events import Event
from pending_actions.broker.lua import (
    CODE_NAME,
    UnknownCodeName,
    inline_codes,
    strip_comments,
)
from pending_actions.broker.pools import LiveView, heartbeat
from pending_actions.broker.replies import BeginStatus, Begun, TakeStatus
from pending_actions.broker.scripts import LUA_TABLES, NAMES, lua_file, prelude, source
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions

TABLE_USE = CODE_NAME  # a script's TABLE.NAME, as broker/lua.py finds it
EVENT_FIELD = re.compile(r"'event',\s*('[^']*'|\"[^\"]*\")")
SLOT = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")


def header_and_body(name: str) -> tuple[str, str]:
    lines = lua_file(name).splitlines()
    n = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    return "\n".join(lines[:n]), "\n".join(lines[n:])


@pytest.mark.parametrize("name", NAMES)
def test_codes_and_events_come_from_the_enums(name: str) -> None:
    source = lua_file(name)
    for table, member in TABLE_USE.findall(source):
        assert member in LUA_TABLES[table].__members__, f"{name}.lua: {table}.{member}"
    assert not EVENT_FIELD.findall(source), f"{name}.lua: a bare event name; use EVENT.X"
    assert "XADD" not in source, f"{name}.lua: write history through the prelude's history()"
    assert "'TIME'" not in source, f"{name}.lua: read the clock through the prelude's now_ms()"


def test_every_event_is_written_somewhere() -> None:
    # the prelude's code (not its comments), as it names them
    code = [lua_file(name) for name in NAMES] + [strip_comments(lua_file("prelude"))]
    used = {m for text in code for t, m in TABLE_USE.findall(text) if t == "EVENT"}
    # set_slot/clear_slot and finalize get theirs from Python (broker/scripts.py, attempt.py)
    from_python = {"DIRECTIVE_SET", "STANDING_SET", "DIRECTIVE_CLEARED", "STANDING_CLEARED",
                   "APPLIED", "DISCARDED", "STALE"}
    assert used | from_python == set(Event.__members__)


@pytest.mark.parametrize("name", NAMES)
def test_header_lists_what_the_script_uses(name: str) -> None:
    header, body = header_and_body(name)
    assert set(SLOT.findall(body)) <= set(SLOT.findall(header)), f"{name}.lua header"
    assert "Returns:" in header


@pytest.mark.parametrize("name", NAMES)
def test_script_loads_with_its_prelude(rc: redis.Redis, name: str) -> None:
    rc.script_load(source(name))


def test_a_misspelt_code_is_refused_when_the_text_is_built(rc: redis.Redis) -> None:
    with pytest.raises(UnknownCodeName, match=r"unknown code name EVENT\.STAGD"):
        inline_codes("return EVENT.STAGD")
    assert rc.eval(inline_codes("return EVENT.LATE_REFUSED"), 0) == b"late-refused"
    assert rc.eval(inline_codes("return TAKE.OK"), 0) == TakeStatus.OK.value.encode()
    # every code name is written as its value: no script builds a table of them
    for name in NAMES:
        assert not TABLE_USE.search(source(name)), name
    # a script gets only the definitions it uses, and those they need
    shebang, rest = source("renew").split("\n", 1)
    assert shebang == "#!lua flags=allow-oom"
    assert rest.startswith(prelude("now_ms()"))
    assert "history" not in source("renew") and "local function history" in prelude(
        "history(k, 1, EVENT.TAKEN)")


def test_begin_reads_counters_only_where_take_says_there_are_some(
        redis_server: EmbeddedRedis) -> None:
    """take copies an action's counters into its lease and says whether the state hash holds
    more (a first attempt: none), so begin reads that hash only then: a first attempt's begin
    does not even see a record planted there, a later attempt's begin gets the last error.
    Driven by hand: a pool with the handler is made live, and no worker serves this prefix."""
    prefix, session = f"bc{uuid.uuid4().hex[:6]}", "s1"
    keys = Keys(prefix)
    rc = redis.Redis.from_url(redis_server.url)
    heartbeat(rc, keys, "p", ["t.ok"], "by-hand", 60_000)
    pa = PendingActions.from_url(redis_server.url, key_prefix=prefix)
    scripts = pa.ctx.scripts
    try:
        action_id = pa.stage(session=session, tool="edit", label="L", apply="t.ok")
        live = LiveView(rc, keys).get()

        def take_and_begin(req: str, plant: bool = False) -> tuple[str, Begun]:
            token = uuid.uuid4().hex
            taken = scripts.take(session, req, "apply", token, "r", b"null", 60, b"{}", live,
                                 None).run()
            assert (taken.status, taken.id) == (TakeStatus.OK, action_id)
            if plant:  # after the take, which reads the hash (and would find it POISON)
                rc.hset(keys.state(session), action_id, b"\x00planted")
            return token, scripts.begin(session, token, "claimant").run()

        token, first = take_and_begin("req-1", plant=True)  # never read: no POISON
        assert first.status is BeginStatus.OK and first.counters is not None
        assert (first.counters.attempts, first.counters.last_error) == (1, None)
        rc.hdel(keys.state(session), action_id)  # readd reads the hash: it would be POISON
        # the attempt fails and puts the action back with its counters, so the next
        # attempt's begin reads them
        scripts.readd(session, token, "req-1", "refused: try again", b'"no"', action_id,
                      1).run()
        _token, second = take_and_begin("req-2")
        assert second.status is BeginStatus.OK and second.counters is not None
        assert (second.counters.attempts, second.counters.last_error) == (
            2, "refused: try again")
    finally:
        pa.close()
        rc.close()
