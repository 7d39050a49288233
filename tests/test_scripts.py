"""The Lua side of the protocol: every script names events and reply codes through the tables
the prelude generates from the Python enums, its header lists exactly the KEYS and ARGV it
uses, it names each of them at its top as ``broker/arguments.py`` does (name and position),
and each one, prelude included, loads in a real Redis."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

import pytest
import redis

from pending_actions.broker import Keys
from pending_actions.broker.arguments import SIGNATURES, TakeArgs
from pending_actions.broker.events import Event
from pending_actions.broker.lua import (
    CODE_NAME,
    UnknownCodeName,
    inline_codes,
    strip_comments,
)
from pending_actions.broker.replies import BeginStatus, Begun, TakeStatus
from pending_actions.broker.routing import LiveView, heartbeat
from pending_actions.broker.scripts import LUA_TABLES, NAMES, ToStage, lua_file, prelude, source
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions

TABLE_USE = CODE_NAME  # a script's TABLE.NAME, as broker/lua.py finds it
EVENT_FIELD = re.compile(r"'event',\s*('[^']*'|\"[^\"]*\")")
SLOT = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")
# a line naming slots: local a, b = KEYS[1], ARGV[2]
NAMING = re.compile(r"^local ([\w, ]+) = ((?:KEYS|ARGV)\[\d+\](?:, (?:KEYS|ARGV)\[\d+\])*)\n",
                    re.M)


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
    # every slot is named in the body (checked below), so the header lists them all
    assert set(SLOT.findall(body)) == set(SLOT.findall(header)), f"{name}.lua header"
    assert "Returns:" in header


def disagreements(code: str, keys: Sequence[str], args: Sequence[str], keys_tail: str = "",
                  args_tail: str = "") -> list[str]:
    """Where script ``code`` (without comments) and the fields of its KEYS and ARGV objects
    disagree: each slot is named by a local of its field's name, in the field's order, only
    there is a slot read by number, and a tail (slots past the fixed ones) starts at a local
    of the given name set to the first slot after them; a script without one reads nothing
    past its named slots."""
    named: dict[str, dict[int, str]] = {"KEYS": {}, "ARGV": {}}
    for names, slots in NAMING.findall(code):
        pairs = list(zip(names.split(", "), SLOT.findall(slots), strict=True))
        for local, (table, at) in pairs:
            named[table][int(at)] = local
    out = []
    rest = NAMING.sub("", code)
    if SLOT.search(rest):
        out.append(f"a slot read by number below the named ones: {SLOT.search(rest)}")
    for table, fields, tail in (("KEYS", keys, keys_tail), ("ARGV", args, args_tail)):
        by_slot = [named[table].get(at) for at in range(1, len(named[table]) + 1)]
        if by_slot != list(fields):
            out.append(f"{table}: the script names {by_slot}, its object {list(fields)}")
        for local in by_slot:
            if local and len(re.findall(rf"\b{local}\b", code)) < 2:
                out.append(f"{table}: {local} named, never used")
        if tail:
            start = re.search(rf"^local {tail} = (\d+)$", code, re.M)
            if not start or int(start.group(1)) != len(fields) + 1:
                out.append(f"{table}: no local {tail} = {len(fields) + 1} (its tail)")
        elif re.search(rf"#{table}\b|\b{table}\[(?!\d+\])", rest):
            out.append(f"{table}: read past its named slots, with no tail named")
    return out


@pytest.mark.parametrize("name", NAMES)
def test_each_slot_is_named_as_its_object_names_it(name: str) -> None:
    sig = SIGNATURES[name]
    code = strip_comments(lua_file(name))
    assert disagreements(code, sig.keys._fields, sig.args._fields, sig.keys_tail,
                         sig.args_tail) == [], f"{name}.lua against broker/arguments.py"


def test_the_slot_check_finds_a_swap() -> None:
    """The check above can fail: take's object with two fields swapped disagrees with take.lua,
    and so does a tail start one off, or a slot read by number."""
    sig = SIGNATURES["take"]
    code = strip_comments(lua_file("take"))
    swapped = list(TakeArgs._fields)
    swapped[0], swapped[2] = swapped[2], swapped[0]
    assert disagreements(code, sig.keys._fields, swapped, sig.keys_tail) == [
        f"ARGV: the script names {list(TakeArgs._fields)}, its object {swapped}"]
    assert disagreements(code.replace("local streams_at = 18", "local streams_at = 17"),
                         sig.keys._fields, sig.args._fields, sig.keys_tail) == [
        "KEYS: no local streams_at = 18 (its tail)"]
    assert disagreements(code + "return ARGV[3]\n", sig.keys._fields, sig.args._fields,
                         sig.keys_tail)
    assert disagreements(code, sig.keys._fields, sig.args._fields) == [
        "KEYS: read past its named slots, with no tail named"]
    assert set(SIGNATURES) == set(NAMES)


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
