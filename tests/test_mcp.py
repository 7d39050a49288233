"""CONTRACT section 8, MCP: ``mcp`` serves ``resolve`` and ``pending``; ``mcp-proxy`` stands in
front of a real MCP server (tests/support/mcp_upstream.py, files in a temp folder), forwards
its reads, stages its writes and applies them from a real worker on ``resolve``. Every server
runs as an MCP client runs it: a process, driven by the official SDK's stdio client."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp_types import ToolAnnotations

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.texts import NOTHING_TO_APPLY, NOTHING_TO_DISCARD, REMINDER
from pending_actions.embedded import EmbeddedRedis
from pending_actions.mcp.proxy import Verdict, decide
from pending_actions.mcp.texts import NOTHING_PENDING, PENDING_DESCRIPTION
from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions, render
from pending_actions.producers.tool import DESCRIPTION, PARAMETERS
from tests.support.mcp import (
    McpWorker,
    connect,
    proxy_args,
    resolved,
    text,
    upstream_command,
    upstream_option,
    writes,
)
from tests.support.mcp_upstream import CHATTER


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def spare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spare")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, folder: Path, spare: Path) -> Iterator[str]:
    """A Redis of its own and a worker with the test handlers and two upstreams: ``files`` on
    its command line, ``spare`` in the setting."""
    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis-mcp")).start()
    setting = orjson.dumps({"spare": upstream_command(spare)}).decode()
    worker = McpWorker(server.url, folder, overrides={"mcp_upstreams": setting}).start()
    yield server.url
    worker.stop()
    server.stop()


@pytest.fixture(scope="module")
def pa(url: str) -> Iterator[PendingActions]:
    client = PendingActions.from_url(url, resolve_timeout_s=30)
    yield client
    client.close()


@pytest.fixture
def session() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def test_mcp_serves_resolve_and_pending_with_the_seed_schema_and_results(
        url: str, pa: PendingActions, session: str) -> None:
    async def body() -> None:
        async with connect(url, "mcp", "--session", session) as mcp:
            listed = {t.name: t for t in (await mcp.list_tools()).tools}
            assert sorted(listed) == ["pending", "resolve"]
            assert listed["resolve"].input_schema == PARAMETERS
            assert listed["resolve"].description == DESCRIPTION
            assert listed["pending"].description == PENDING_DESCRIPTION

            nothing = await mcp.call_tool("resolve", {"action": "apply", "reason": "r"})
            assert nothing.is_error and NOTHING_TO_APPLY in text(nothing)
            nothing = await mcp.call_tool("resolve", {"action": "discard", "reason": "r"})
            assert not nothing.is_error and NOTHING_TO_DISCARD in text(nothing)
            empty = await mcp.call_tool("pending", {})
            assert text(empty) == NOTHING_PENDING

            action_id = pa.stage(session=session, tool="edit", label="Fix typo", apply="t.ok")
            listing = await mcp.call_tool("pending", {})
            assert action_id in text(listing) and "Fix typo" in text(listing)
            assert text(listing).endswith(REMINDER)  # MCP cannot force the tool choice

            done = await mcp.call_tool("resolve", {"action": "apply", "reason": "looks right"})
            result = resolved(done)
            assert not done.is_error and not result.is_error
            assert text(done) == render(result)  # the rendered result, the seed's texts
            assert text(done).startswith("Accept: Fix typo\n  reason: looks right")
            assert pa.pending(session) == []

            pa.stage(session=session, tool="edit", label="Doomed", apply="t.toolerror")
            failed = await mcp.call_tool("resolve", {"action": "apply", "reason": "try"})
            assert failed.is_error and text(failed).startswith("Failed: Doomed")
            assert text(failed) == render(resolved(failed))
            gone = await mcp.call_tool("resolve", {"action": "discard", "reason": "no"})
            assert text(gone).startswith("Discard: Doomed")
            assert "Discarded: Doomed. Reason: no" in text(gone)

            bad = await mcp.call_tool("resolve", {"action": "maybe", "reason": "r"})
            assert bad.is_error and "action" in text(bad)
            bad = await mcp.call_tool("resolve", {"action": "apply", "reason": "r",
                                                  "session": "another"})
            assert bad.is_error and "invalid session: not an argument of resolve" in text(bad)

    anyio.run(body)


def test_proxy_offers_the_upstreams_tools_and_ours(url: str, folder: Path,
                                                   session: str) -> None:
    async def body() -> None:
        async with connect(url, *proxy_args(session, folder)) as proxy:
            listed = {t.name: t for t in (await proxy.list_tools()).tools}
            assert sorted(listed) == ["fail", "pending", "read_file", "resolve", "write_file"]
            assert listed["read_file"].annotations == ToolAnnotations(read_only_hint=True)
            assert listed["write_file"].annotations is None
            assert listed["write_file"].input_schema["required"] == ["path", "text"]
            assert listed["resolve"].input_schema == PARAMETERS

    anyio.run(body)


def test_proxy_forwards_a_read_and_stages_a_write_that_resolve_applies_once(
        url: str, pa: PendingActions, folder: Path, session: str) -> None:
    path = f"{session}.txt"
    (folder / f"{session}-before.txt").write_text("already there")

    async def body() -> None:
        async with connect(url, *proxy_args(session, folder)) as proxy:
            read = await proxy.call_tool("read_file", {"path": f"{session}-before.txt"})
            assert not read.is_error and text(read) == "already there"  # no reminder: none
            assert pa.pending(session) == []

            arguments = {"path": path, "text": "hello"}
            staged = await proxy.call_tool("write_file", arguments)
            assert not staged.is_error
            [action] = pa.pending(session)
            assert re.fullmatch(r"pending-action:write_file:\d+", action.id)
            assert (action.tool, action.apply, action.payload) == \
                ("write_file", "mcp:files", arguments)  # exactly the model's arguments
            said = text(staged)
            assert action.id in said and "nothing has happened yet" in said
            assert "`resolve`" in said and said.endswith(REMINDER)
            assert not (folder / path).exists()  # not run

            read = await proxy.call_tool("read_file", {"path": f"{session}-before.txt"})
            assert text(read) == f"already there\n{REMINDER}"  # something is pending

            done = await proxy.call_tool("resolve", {"action": "apply", "reason": "go"})
            assert not done.is_error, text(done)
            assert resolved(done).text == "Wrote 5 characters to " + path  # the upstream's text
            assert text(done).startswith("Accept: write_file")
            assert (folder / path).read_text() == "hello"
            mine = [w for w in writes(folder) if w["path"] == path]
            assert [(w["key"], w["attempt"]) for w in mine] == [(action.id, 1)]
            assert pa.pending(session) == []

            # the worker keeps its upstream process and reuses it: the next apply is written
            # by the same process
            await proxy.call_tool("write_file", {"path": path, "text": "again"})
            done = await proxy.call_tool("resolve", {"action": "apply", "reason": "go"})
            assert not done.is_error and (folder / path).read_text() == "again", text(done)
            first, second = [w for w in writes(folder) if w["path"] == path]
            assert first["pid"] == second["pid"]

    anyio.run(body)


def test_an_upstreams_stderr_reaches_ours_marked_with_its_name(url: str, folder: Path,
                                                               session: str,
                                                               tmp_path: Path) -> None:
    """Issue 41, item 12: what the upstream writes on its stderr (lines in one write, a line cut
    across two writes, a last line with no newline, written as it exits) reaches the proxy's
    stderr line by line, each led by `[mcp:files] `, and none of it unmarked."""
    log = tmp_path / "proxy-stderr.txt"
    args = ["mcp-proxy", "--session", session, "--upstream", "files", "--mcp-upstream",
            upstream_option(folder, "--chatter")]

    async def body() -> None:
        with log.open("w") as errlog:
            async with connect(url, *args, errlog=errlog) as proxy:
                assert "read_file" in {t.name for t in (await proxy.list_tools()).tools}

    anyio.run(body)
    lines = log.read_text().splitlines()
    assert [line for line in lines if line.startswith("[mcp:files] ")] == \
        [f"[mcp:files] {said}" for said in CHATTER], lines
    assert not [line for line in lines for said in ("starting", "half", "bye")
                if said in line and not line.startswith("[mcp:files] ")], lines


def test_an_upstreams_stderr_in_a_workers_log_is_marked_with_its_name(
        url: str, folder: Path, tmp_path: Path) -> None:
    """The same in a worker's log: its start tries each upstream (``--mcp-upstream``), whose
    stderr reaches the log line by line, each led by `[mcp:files] `, none of it unmarked."""
    log = tmp_path / "worker.log"
    worker = McpWorker(url, folder, flags=("--chatter",), log_path=log).start()
    assert worker.stop(30) == 0
    lines = log.read_text().splitlines()
    marked = [line for line in lines if line.startswith("[mcp:files] ")]
    assert marked and {line.removeprefix("[mcp:files] ") for line in marked} == set(CHATTER), \
        lines
    assert not [line for line in lines for said in ("starting", "half", "bye")
                if said in line and not line.startswith("[mcp:files] ")], lines


def test_proxy_discards_a_staged_write(url: str, pa: PendingActions, folder: Path,
                                       session: str) -> None:
    path = f"{session}.txt"

    async def body() -> None:
        async with connect(url, *proxy_args(session, folder)) as proxy:
            await proxy.call_tool("write_file", {"path": path, "text": "no"})
            [action] = pa.pending(session)
            gone = await proxy.call_tool("resolve", {"action": "discard", "reason": "wrong"})
            assert not gone.is_error
            assert resolved(gone).text == f"Discarded: {action.label}. Reason: wrong"
            assert pa.pending(session) == []
            assert not (folder / path).exists()
            assert [w for w in writes(folder) if w["path"] == path] == []

    anyio.run(body)


def test_a_persons_edit_changes_the_arguments_checked_against_the_input_schema(
        url: str, pa: PendingActions, folder: Path, session: str) -> None:
    path = f"{session}.txt"

    async def body() -> None:
        async with connect(url, *proxy_args(session, folder, "--tenant", "acme")) as proxy:
            await proxy.call_tool("write_file", {"path": path, "text": "first draft"})

    anyio.run(body)
    [action] = pa.pending(session)
    assert action.tenant == "acme"
    assert action.payload_schema is not None and "text" in action.payload_schema["properties"]
    with pytest.raises(InvalidInput, match="edit"):
        pa.resolve(session=session, action="apply", reason="r", edit={"text": 5})
    done = pa.resolve(session=session, action="apply", reason="edited", edit={"text": "final"})
    assert not done.is_error, done.text
    assert (folder / path).read_text() == "final"


def test_a_worker_has_the_upstreams_of_its_options_and_of_the_setting(
        pa: PendingActions, folder: Path, spare: Path, session: str) -> None:
    for name, where in (("files", folder), ("spare", spare)):
        pa.stage(session=session, tool="write_file", label=name, apply=f"mcp:{name}",
                 payload={"path": f"{session}.txt", "text": name})
        done = pa.resolve(session=session, action="apply", reason="r")
        assert not done.is_error, done.text
        assert (where / f"{session}.txt").read_text() == name


def test_staging_for_an_upstream_no_worker_has_is_an_error_result(
        url: str, pa: PendingActions, folder: Path, session: str) -> None:
    args = ["mcp-proxy", "--session", session, "--upstream", "other",
            "--mcp-upstream", upstream_option(folder, name="other")]

    async def body() -> None:
        async with connect(url, *args) as proxy:
            refused = await proxy.call_tool("write_file", {"path": "x.txt", "text": "x"})
            assert refused.is_error
            assert "no live worker has a handler named 'mcp:other'" in text(refused)
            assert text(refused).endswith("Nothing was run or staged.")
            assert pa.pending(session) == []

    anyio.run(body)


def test_arguments_past_the_payload_limits_are_refused_and_nothing_is_staged(
        url: str, pa: PendingActions, folder: Path, session: str) -> None:
    deep: dict[str, Any] = {}
    for _ in range(70):
        deep = {"x": deep}

    async def body() -> None:
        async with connect(url, *proxy_args(session, folder), max_payload_bytes="1000") as proxy:
            big = await proxy.call_tool("write_file", {"path": "big.txt", "text": "x" * 2000})
            assert big.is_error and "invalid arguments" in text(big)
            assert "the limit is 1000" in text(big) and "Nothing was run or staged" in text(big)
            nested = await proxy.call_tool("read_file", {"path": "a", "deep": deep})
            assert nested.is_error and "nested deeper than 64 levels" in text(nested)
            assert pa.pending(session) == []

    anyio.run(body)


def test_without_a_policy_the_upstreams_read_only_hint_decides() -> None:
    read_only = ToolAnnotations(read_only_hint=True)

    async def body() -> None:
        allowed = await decide("t", "s", "read_file", {}, read_only)
        assert (allowed.decision, allowed.rule) == ("allow", None)
        assert "readOnlyHint" in allowed.reason
        for hints in (None, ToolAnnotations(read_only_hint=False), ToolAnnotations()):
            asked = await decide("t", "s", "write_file", {}, hints)
            assert (asked.decision, asked.rule) == ("ask", None)
        # a hint never refuses: destructive is still asked, not denied
        destructive = ToolAnnotations(destructive_hint=True)
        assert (await decide("t", "s", "rm", {}, destructive)).decision == "ask"

    anyio.run(body)


def test_a_policy_plugged_into_decide_decides_first() -> None:
    """The seam the policies issue plugs into: a policy (sync or async) decides; one that has
    nothing for the tenant (None) leaves it to the hint."""
    seen: list[tuple[Any, ...]] = []

    def policy(*call: Any) -> Verdict | None:
        seen.append(call)
        return Verdict("deny", "no deletes", "no-rm") if call[2] == "rm" else None

    async def later(*call: Any) -> Verdict | None:
        return Verdict("allow", "trusted", "all") if call[0] == "trusted" else None

    async def body() -> None:
        read_only = ToolAnnotations(read_only_hint=True)
        denied = await decide("acme", "s1", "rm", {"path": "a"}, read_only, policy)
        assert denied == Verdict("deny", "no deletes", "no-rm")
        assert seen == [("acme", "s1", "rm", {"path": "a"}, read_only)]
        assert (await decide("acme", "s1", "cat", {}, read_only, policy)).decision == "allow"
        assert (await decide("trusted", "s", "rm", {}, None, later)).rule == "all"
        assert (await decide("other", "s", "rm", {}, None, later)).decision == "ask"

    anyio.run(body)


def test_the_readme_configures_an_mcp_client_with_the_proxy() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Inside the agent's tools (MCP)"):]
    section = section[:section.index("\n## ", 1)]
    assert len(section.splitlines()) < 45  # well under a screen
    [snippet] = re.findall(r"```json\n(.*?)```", section, re.S)
    config = orjson.loads(snippet)
    [server] = config["mcpServers"].values()
    assert server["command"] == "pending-actions" and server["args"][0] == "mcp-proxy"
    assert "--mcp-upstream" in server["args"]
    assert "pending-actions worker" in section and "--mcp-upstream" in section


def test_proxy_calls_are_decided_by_the_tenants_policy(url: str, pa: PendingActions,
                                                       folder: Path, session: str) -> None:
    """With a policy, it decides instead of the readOnlyHint: a denied write is refused with
    the rule's reason, nothing runs or is staged, and the history records it denied; an
    allowed write goes straight through; a read the policy asks people for is staged, with its
    decision on the action."""
    tenant = f"mcp-{uuid.uuid4().hex[:6]}"
    pa.set_policy({"rules": [
        {"name": "no-secrets", "match": {"tool": "write_file", "payload": {"path": "*.key"}},
         "decision": "deny", "reason": "keys are not written by agents"},
        {"name": "writes", "match": {"tool": "write_file"}, "decision": "allow"},
        {"name": "careful-reads", "match": {"tool": "read_file"}, "decision": "ask"}]},
        tenant=tenant)
    (folder / f"{session}-r.txt").write_text("secret-ish")

    async def body() -> None:
        async with connect(url, *proxy_args(session, folder, "--tenant", tenant)) as proxy:
            refused = await proxy.call_tool("write_file", {"path": f"{session}.key",
                                                           "text": "x"})
            assert refused.is_error
            assert text(refused) == ("Denied by policy rule no-secrets: keys are not written "
                                     "by agents. Nothing was run.")
            assert not (folder / f"{session}.key").exists() and pa.pending(session) == []
            # audited as a denied stage would be: the rule, the reason, the arguments' id
            [denial] = [e for e in pa.history(session) if e["event"] == "denied"]
            assert (denial["rule"], denial["reason"]) == ("no-secrets",
                                                          "keys are not written by agents")
            assert denial["id"].startswith("pending-action:write_file:")
            written = await proxy.call_tool("write_file", {"path": f"{session}.txt",
                                                           "text": "hi"})
            assert not written.is_error and (folder / f"{session}.txt").read_text() == "hi"
            staged = await proxy.call_tool("read_file", {"path": f"{session}-r.txt"})
            assert not staged.is_error and "nothing has happened yet" in text(staged)
            [action] = pa.pending(session)
            assert action.policy is not None and action.policy["rule"] == "careful-reads"
            held = await proxy.call_tool("resolve", {"action": "apply", "reason": "go"})
            assert held.is_error and "Needs approval:" in text(held)
            # the model cannot name itself a person: resolve takes no approver
            assert "approver" not in PARAMETERS["properties"]
            sneaky = await proxy.call_tool("resolve", {"action": "apply", "reason": "go",
                                                       "approver": "alice"})
            assert sneaky.is_error and "invalid approver: not an argument" in text(sneaky)
            assert len(pa.pending(session)) == 1 and pa.pending(session)[0].approved_by == []

    anyio.run(body)
