"""The Lua side of the protocol: every script names events and reply codes through the tables
the prelude generates from the Python enums; its header, the one declaration of its slots, is
refused when malformed and agrees with what its code reads; and each one, prelude included,
loads in a real Redis."""

from __future__ import annotations

import re
import uuid

import pytest
import redis

from pending_actions.broker import Keys
from pending_actions.broker.atomic.declared import SCRIPTS, BadHeader, Declared, parse
from pending_actions.broker.atomic.replies import BeginStatus, Begun, TakeStatus
from pending_actions.broker.atomic.scripts import (
    LUA_TABLES,
    NAMES,
    ToStage,
    lua_file,
    prelude,
    source,
)
from pending_actions.broker.atomic.source import (
    CODE_NAME,
    UnknownCodeName,
    inline_codes,
    strip_comments,
)
from pending_actions.broker.events import Event
from pending_actions.broker.routing import LiveView, heartbeat
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions

TABLE_USE = CODE_NAME  # a script's TABLE.NAME, as broker/atomic/source.py finds it
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
    # set_slot/clear_slot and finalize get theirs from Python (broker/atomic/scripts.py, attempt.py)
    from_python = {"DIRECTIVE_SET", "STANDING_SET", "DIRECTIVE_CLEARED", "STANDING_CLEARED",
                   "APPLIED", "DISCARDED", "STALE"}
    assert used | from_python == set(Event.__members__)


def disagreements(declared: Declared, code: str) -> list[str]:
    """Where script ``code`` (without comments) and its header disagree: a slot it declares
    that the code never reads, a slot the code reads by number (the header's names are the
    only way in), slots read past the fixed ones without a tail declared, a tail declared and
    never read."""
    out = [f"a slot read by number: {m.group(0)}" for m in SLOT.finditer(code)]
    for table, names, tail in (("KEYS", declared.keys, declared.keys_tail),
                               ("ARGV", declared.argv, declared.argv_tail)):
        for local in names:
            if not re.search(rf"\b{local}\b", code):
                out.append(f"{table}: {local} declared, never read")
        if tail and not re.search(rf"\b{tail}_at\b", code):
            out.append(f"{table}: the tail {tail} declared, never read")
        if not tail and re.search(rf"#{table}\b|\b{table}\[", code):
            out.append(f"{table}: read past its declared slots, with no tail declared")
    return out


@pytest.mark.parametrize("name", NAMES)
def test_each_header_agrees_with_its_code(name: str) -> None:
    header, _body = header_and_body(name)
    assert disagreements(SCRIPTS[name], strip_comments(lua_file(name))) == [], f"{name}.lua"
    assert not SLOT.search(header), f"{name}.lua: its header names a slot by number"


def test_the_agreement_check_can_fail() -> None:
    """The check above finds a slot the code stopped reading, a slot read by number, a tail
    read without being declared, and one declared and never read."""
    take, code = SCRIPTS["take"], strip_comments(lua_file("take"))
    assert disagreements(take, code.replace("expect_id", "wanted_id")) == [
        "ARGV: expect_id declared, never read"]
    assert "a slot read by number: ARGV[3]" in disagreements(take, code + "return ARGV[3]\n")
    no_tail = Declared(**{**vars(take), "keys_tail": ""})
    assert disagreements(no_tail, code) == [
        "KEYS: read past its declared slots, with no tail declared"]
    assert disagreements(take, code.replace("streams_at", "pools_at")) == [
        "KEYS: the tail streams declared, never read"]


GOOD = """-- name: demo
-- What it does.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   stack  (zset)
--   ...more  the rest
-- ARGV
--   token  lease token
--          (more on it)
-- Returns: 1
return 1
"""


def test_a_header_is_read_into_its_declaration() -> None:
    assert parse("lua/demo.lua", GOOD) == Declared(
        "demo", "What it does.", ("allow-oom",), ("worker",), ("stack",), ("token",),
        keys_tail="more")
    assert parse("lua/demo.lua", GOOD).locals() == (
        "local stack = KEYS[1]\nlocal more_at = 2\nlocal token = ARGV[1]\n")


@pytest.mark.parametrize(("change", "line", "says"), [
    (("-- name: demo", "-- name: other"), 1, "is not the file's"),
    (("-- name: demo\n", "-- demo\n"), 1, "expected a line starting '-- name:'"),
    (("-- flags: allow-oom", "-- flags: allow_oom"), 3, "unknown flag 'allow_oom'"),
    (("-- roles: worker", "-- roles: workers"), 4, "unknown role 'workers'"),
    (("-- roles: worker\n", ""), 4, "expected a line starting '-- roles:'"),
    (("-- KEYS\n", "-- keys\n"), 5, "expected '-- KEYS'"),
    (("--   ...more  the rest\n", "--   ...more  the rest\n--   late  x\n"), 8,
     "a tail comes last"),
    (("--   token  lease token", "--   stack  lease token"), 9, "names a slot twice"),
    (("--   token  lease token", "--   end  lease token"), 9, "is a keyword"),
    (("--   token  lease token", "--   token-id  lease token"), 9, "a slot is"),
    (("-- Returns: 1\n", ""), 11, "no '-- Returns:'"),
])
def test_a_malformed_header_is_refused_naming_file_and_line(
        change: tuple[str, str], line: int, says: str) -> None:
    with pytest.raises(BadHeader, match=rf"^lua/demo\.lua:{line}: .*{re.escape(says)}"):
        parse("lua/demo.lua", GOOD.replace(*change))


def test_the_prelude_reads_no_slot() -> None:
    # its definitions are given what they work on: a script names its slots itself
    assert not re.search(r"\b(KEYS|ARGV)\b", strip_comments(lua_file("prelude")))


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
            taken = scripts.take(session, req=req, action="apply", token=token, reason="r",
                                 extra=b"null", marker_ttl_s=60, none_reply=b"{}", live=live,
                                 message=None).run()
            assert (taken.status, taken.id) == (TakeStatus.OK, action_id)
            if plant:  # after the take, which reads the hash (and would find it POISON)
                rc.hset(keys.state(session), action_id, b"\x00planted")
            return token, scripts.begin(session, token=token, claimant="claimant").run()

        token, first = take_and_begin("req-1", plant=True)  # never read: no POISON
        assert first.status is BeginStatus.OK and first.counters is not None
        assert (first.counters.attempts, first.counters.last_error) == (1, None)
        rc.hdel(keys.state(session), action_id)  # readd reads the hash: it would be POISON
        # the attempt fails and puts the action back with its counters, so the next
        # attempt's begin reads them
        scripts.readd(session, token=token, req="req-1", last_error="refused: try again",
                      reply=b'"no"', action_id=action_id, attempt=1).run()
        _token, second = take_and_begin("req-2")
        assert second.status is BeginStatus.OK and second.counters is not None
        assert (second.counters.attempts, second.counters.last_error) == (
            2, "refused: try again")
    finally:
        pa.close()
        rc.close()


def test_a_stage_records_fields_are_to_stages() -> None:
    """stage.lua reads each action's record by field name (its ``RECORD``), in the order of
    ``ToStage``'s fields, which build it (``req`` is the client's own: a key, not an
    argument)."""
    [record] = re.findall(r"^local RECORD = \{(.*)\}$", lua_file("stage"), re.M)
    assert re.findall(r"'(\w+)'", record) == [f for f in ToStage._fields if f != "req"]
    assert ToStage._fields[-1] == "req"  # after the record: never sent as an argument
