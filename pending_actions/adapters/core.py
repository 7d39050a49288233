"""What every framework adapter shares: a staged tool's handler, the one decision of each call,
and the life of a run that pauses in one process and goes on in another (docs/adapters.md).

A framework module (``openai_agents``, ``pydantic_ai``, ``langgraph``) only translates: its
``staged`` builds the framework's own tool object around a ``Tool``, whose calls ask
``current().decide``; its ``Framework`` starts the framework's run and continues a paused one.
Everything else is here, once: staging the paused calls, keeping the framework's state in
Redis (claim_run.lua, save_run.lua), telling each call's outcome on resume, and waiting."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import inspect
import time
import unicodedata
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from pending_actions.broker import texts
from pending_actions.broker.atomic.replies import RunClaim, RunClaimed
from pending_actions.broker.errors import (
    Denied,
    ForeignSession,
    InvalidInput,
    NotPaused,
    PendingActionsError,
)
from pending_actions.broker.events import Event, Fate
from pending_actions.broker.models import PendingAction, check_handler_name
from pending_actions.producers import AsyncPendingActions
from pending_actions.workers import outcomes
from pending_actions.workers.registry import handler

LABEL_CHARS = 200  # a label is one line people scan in the inbox
VALUE_CHARS = 60  # one argument's value in it


@dataclass(frozen=True)
class AgentRun:
    """What ``run`` and ``resume`` come to: ``done`` with the framework's final ``output``, or
    ``paused`` waiting for the pending actions ``pending`` (their ids)."""

    status: Literal["done", "paused"]
    output: Any
    pending: list[str]
    session: str


@dataclass(frozen=True)
class ToolCall:
    """One call a framework paused on: its own id of the call, the tool, the arguments."""

    call_id: str
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Applying:
    """The apply of a staged tool's call in progress in this worker thread: a body that makes
    its own effects exactly-once keys them by ``idempotency_key`` (the same for every attempt
    of one action)."""

    action_id: str
    session: str
    idempotency_key: str
    attempt: int


_applying: contextvars.ContextVar[Applying | None] = contextvars.ContextVar(
    "pending_actions_applying", default=None)


def applying() -> Applying | None:
    """The apply in progress, inside a staged tool's body run by a worker; None when the body
    runs in the agent's own process (a call the policy allowed)."""
    return _applying.get()


def result_text(value: object) -> str:
    """What the model is given for a body's return value applied by a worker: a str as it is,
    anything else as JSON (None as "null": the model sees that the call returned nothing)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, default=str).decode()


def label(tool: str, arguments: dict[str, Any]) -> str:
    """One line people recognise a call by: ``write_note(path="a.txt", text="hello")``. The
    model wrote the arguments: what could break the line or hide text from a reader (line and
    paragraph separators, bidirectional and other format controls) is written as an escape, and
    a long value shows its head and its tail."""
    shown = []
    for name, value in arguments.items():
        text = _visible(orjson.dumps(value, default=str).decode())
        shown.append(f"{_visible(str(name))}={_middle(text, VALUE_CHARS)}")
    return _cut(f"{tool}({', '.join(shown)})", LABEL_CHARS)


def _visible(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in _HIDDEN else c
                   for c in text)


_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}


def _middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    tail = limit // 3
    return text[:limit - tail - 1] + "…" + text[-tail:]


def digest(tool: str, arguments: object) -> str:
    """What a call is, apart from its id: its tool and the arguments the model wrote (as JSON,
    before any validation: a default made anew or a set's order would differ each time). A
    verdict given for a call id holds for a call of that id only when this is the same, so a
    later call that reuses an id (a model's own ids, a script's) is decided as itself."""
    body = orjson.dumps([tool, arguments], default=str, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(body).hexdigest()[:32]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


Arguments = Callable[[dict[str, Any]], tuple[Sequence[Any], dict[str, Any]]]


def _as_keywords(payload: dict[str, Any]) -> tuple[Sequence[Any], dict[str, Any]]:
    return (), payload


class Tool:
    """What ``staged`` knows of one tool, whatever the framework: its body ``fn``, registered as
    the worker handler ``<extra>:<name>`` (every worker that imports the module defining the
    tool has it); ``asks``: the framework's own approval flag was set on it, so its calls are
    at least ``ask`` (people decide), whatever the policy allows; ``arguments``: how a payload
    (JSON) becomes ``fn``'s arguments, validated by the framework's own schema of ``fn`` (a
    model argument is a model again, a date a date), so that the body gets in a worker what it
    would get from the framework here."""

    def __init__(self, extra: str, name: str, fn: Callable[..., Any], asks: bool = False,
                 arguments: Arguments = _as_keywords) -> None:
        self.extra, self.name, self.fn, self.asks = extra, name, fn, asks
        self.arguments = arguments
        self.handler = check_handler_name("name", f"{extra}:{name}")
        body = _async_body(self) if inspect.iscoroutinefunction(fn) else _body(self)
        # named as the body is, so that a module imported twice registers the same handler,
        # and another function under the same name is refused (workers/registry.py)
        body.__module__, body.__qualname__ = fn.__module__, fn.__qualname__
        handler(self.handler)(body)
        _TOOLS[(extra, name)] = self

    def call(self, payload: dict[str, Any]) -> Any:
        args, kwargs = self.arguments(payload)
        return self.fn(*args, **kwargs)

    async def call_local(self, payload: dict[str, Any]) -> Any:
        """The body run here, as the framework runs a tool: for a call the policy allowed."""
        if inspect.iscoroutinefunction(self.fn):
            return await self.call(payload)
        return await asyncio.to_thread(self.call, payload)


_TOOLS: dict[tuple[str, str], Tool] = {}


def _body(tool: Tool) -> Callable[..., str]:
    def apply(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
              idempotency_key: str) -> str:
        token = _applying.set(Applying(action.id, action.session, idempotency_key,
                                       action.attempts))
        try:
            text = result_text(tool.call(action.payload))
        finally:
            _applying.reset(token)
        outcomes.keep(action, text)
        return text
    return apply


def _async_body(tool: Tool) -> Callable[..., Awaitable[str]]:
    async def apply(*, action: PendingAction, reason: str, extra: dict[str, Any] | None,
                    idempotency_key: str) -> str:
        token = _applying.set(Applying(action.id, action.session, idempotency_key,
                                       action.attempts))
        try:
            text = result_text(await tool.call(action.payload))
        finally:
            _applying.reset(token)
        outcomes.keep(action, text)
        return text
    return apply


@dataclass(frozen=True)
class Verdict:
    """What ``decide`` says of one call: run it here (``allow``), pause for people (``ask``),
    give the model ``text`` as the call's result (``deny``: the refusal; ``resolved``: what
    people decided, on resume)."""

    decision: Literal["allow", "ask", "deny", "resolved"]
    text: str = ""


@dataclass
class Running:
    """One ``run`` or ``resume`` in progress in this process: what a staged tool's call asks."""

    pa: AsyncPendingActions
    session: str
    tenant: str
    outcomes: dict[str, str] = field(default_factory=dict)  # call id -> text, decided before
    applied: set[str] = field(default_factory=set)  # those of them a worker applied
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    # call id -> ``digest`` of the call its verdict was given for
    digests: dict[str, str] = field(default_factory=dict)
    staged: dict[str, str] = field(default_factory=dict)  # call id -> action id staged already
    # call id -> the rule its stage names when people decide it though no policy rule asked
    people: dict[str, str] = field(default_factory=dict)
    # call id -> the context the call was decided in: its stage carries that span context
    contexts: dict[str, contextvars.Context] = field(default_factory=dict)

    def resolved(self, call_id: str) -> str | None:
        """What people decided for a call the run paused on (a resume). A later call that
        reuses its id gets this text too, and nothing runs for it: no verdict is taken from
        it."""
        return self.outcomes.get(call_id)

    def was_applied(self, call_id: str) -> bool:
        """Whether a call decided before (``resolved``) was applied by a worker; else it did
        not happen (discarded, refused, expired, set aside): a framework that records the two
        apart (an approval, a rejection) tells them by this, never by the text."""
        return call_id in self.applied

    def verdict(self, call_id: str) -> Verdict | None:
        return self.verdicts.get(call_id)

    async def decide(self, tool: Tool, call_id: str, arguments: dict[str, Any],
                     raw: object = None) -> Verdict:
        """The one decision of a call of a staged tool. A call people decided (a resume) gives
        what they decided, and nothing is asked again (a framework that re-runs a tool on
        resume stages nothing twice). Otherwise the tenant's policy decides, as a stage of the
        call would be decided (``tool``, ``payload`` = the arguments, ``apply`` = the handler);
        the framework's approval flag makes it at least ``ask``, and so does no policy at all:
        a staged tool is staged unless a policy allows it. A deny is staged, so that the stage
        refuses it and the session's history records ``denied``. ``raw``: the arguments as the
        model wrote them, when ``arguments`` are their validated form.

        A verdict is given once per call and kept for a second ask of the same call (a
        framework that asks before it runs a tool and again as it runs it); a call that reuses
        the id of another (other tool or arguments) is refused, never run on that verdict."""
        if call_id in self.outcomes:
            return Verdict("resolved", self.outcomes[call_id])
        try:
            this = digest(tool.name, arguments if raw is None else raw)
            shown = label(tool.name, arguments)
            orjson.dumps(arguments)
        except (TypeError, orjson.JSONEncodeError) as exc:  # a lone surrogate, 256 levels deep
            return Verdict("deny", f"Refused: the arguments of {tool.name} cannot be kept as "
                           f"JSON ({exc}). Nothing was run.")
        seen = self.digests.get(call_id)
        if seen is not None and seen != this:
            return Verdict("deny", f"Refused: the call id {call_id!r} was already used by "
                           "another call in this run. Nothing was run.")
        known = self.verdicts.get(call_id)
        if known is not None:
            return known
        self.digests[call_id] = this
        found = await self.pa.decide(session=self.session, tool=tool.name, apply=tool.handler,
                                     label=shown, payload=arguments, tenant=self.tenant)
        decision = "ask" if found is None else found.decision
        if decision == "allow" and tool.asks:
            decision = "ask"
        if found is None or tool.asks:
            # staged as people's to decide, not the policy's (which would allow it, or is none)
            self.people[call_id] = f"{tool.extra}:{'approval' if tool.asks else 'no-policy'}"
        verdict = Verdict("ask") if decision == "ask" else Verdict("allow")
        if decision == "deny":
            try:
                self.staged[call_id] = await self.stage(tool, call_id, arguments)
            except Denied as exc:
                verdict = Verdict("deny", refusal(exc))
            else:  # the policy changed in between and the stage did not refuse it: pending
                verdict = Verdict("ask")
        self.verdicts[call_id] = verdict
        self.contexts[call_id] = contextvars.copy_context()
        return verdict

    async def stage(self, tool: Tool, call_id: str, arguments: dict[str, Any]) -> str:
        """The call as a pending action. One the policy did not ask people for (its tool has
        the framework's approval flag, or the tenant has no policy) is staged as an ``ask`` of
        at least one person all the same, so that no resolve but a person's applies it."""
        ids = await self.pa.stage_many([{
            "session": self.session, "tool": tool.name, "label": label(tool.name, arguments),
            "apply": tool.handler, "payload": arguments, "tenant": self.tenant,
            "people": self.people.get(call_id),
            # what no run comes back for (its process died between this stage and the save
            # of its run) ends as expired, not pending for ever
            "ttl": self.pa.settings.run_ttl_s}])
        return ids[0]


def refusal(exc: Denied) -> str:
    """What the model reads of a refused call: the rule's reason and the rule."""
    return f"{exc}. Nothing was run."


_running: contextvars.ContextVar[Running] = contextvars.ContextVar("pending_actions_running")


def current() -> Running:
    """The run in progress: a staged tool is called only inside ``run`` or ``resume``."""
    try:
        return _running.get()
    except LookupError:
        raise RuntimeError(
            "a staged tool was called outside pending_actions.adapters' run() or resume(): "
            "its call cannot be decided, so it is not run") from None


@dataclass(frozen=True)
class Done:
    output: Any


@dataclass(frozen=True)
class Paused:
    """The framework paused: its own serialized ``state`` ("" where the framework keeps it
    itself, as LangGraph's checkpointer does) and the calls it waits for."""

    state: str
    calls: list[ToolCall]


Step = Done | Paused


class Framework(Protocol):
    extra: str

    async def start(self, agent: Any, input: Any, session: str,
                    options: dict[str, Any]) -> Step: ...

    async def cont(self, agent: Any, state: str, session: str,
                   options: dict[str, Any]) -> Step: ...


async def run(fw: Framework, agent: Any, input: Any, *, session: str, tenant: str,
              pa: AsyncPendingActions | None, wait: float, options: dict[str, Any]) -> AgentRun:
    """Run ``agent`` on ``input`` in this process, as the session's run (one at a time)."""
    async with _client(pa) as client:
        deadline = time.monotonic() + wait
        token = uuid.uuid4().hex
        claim = await client.claim_run(session, tenant, token, fresh=True)
        if claim.status is RunClaim.FOREIGN:
            raise ForeignSession(f"session {session!r} belongs to another tenant")
        if claim.status is RunClaim.PAUSED:
            raise InvalidInput("session", f"{session!r} has a paused run: resume() it (or "
                               "resolve its pending actions) before starting another")
        if claim.status is RunClaim.BUSY:
            raise NotPaused(session, busy=True)
        running = Running(client, session, tenant)
        try:
            got = await _go(fw, agent, running, token,
                            lambda: fw.start(agent, input, session, options), options)
        except BaseException:
            # nothing kept paused: the session is free again at once, not when the lease runs
            # out (a no-op once the lease is let go or taken over: fenced by the token)
            await client.save_run(session, token, done=True)
            raise
        return await _waited(fw, agent, got, client, tenant, deadline, options)


async def resume(fw: Framework, agent: Any, *, session: str, tenant: str,
                 pa: AsyncPendingActions | None, wait: float,
                 options: dict[str, Any]) -> AgentRun:
    """Continue the session's paused run once its pending actions are resolved; while one is
    still pending (a failed apply included) it stays paused. Two resumes at once: one goes on,
    the other raises ``NotPaused`` (busy)."""
    async with _client(pa) as client:
        deadline = time.monotonic() + wait
        got = await _resume_once(fw, agent, client, session, tenant, deadline, options)
        return await _waited(fw, agent, got, client, tenant, deadline, options)


async def _waited(fw: Framework, agent: Any, got: AgentRun, client: AsyncPendingActions,
                  tenant: str, deadline: float, options: dict[str, Any]) -> AgentRun:
    """``wait``: while the run is paused and time is left, wait for people and go on (one
    deadline for the whole call, however often the run pauses again)."""
    while got.status == "paused" and time.monotonic() < deadline:
        got = await _resume_once(fw, agent, client, got.session, tenant, deadline, options)
    return got


async def _resume_once(fw: Framework, agent: Any, client: AsyncPendingActions, session: str,
                       tenant: str, deadline: float, options: dict[str, Any]) -> AgentRun:
    while True:
        token = uuid.uuid4().hex
        claim = await client.claim_run(session, tenant, token, fresh=False)
        if claim.status is RunClaim.BUSY:
            raise NotPaused(session, busy=True)
        if claim.status is not RunClaim.CLAIMED:  # none, or another tenant's: the same
            raise NotPaused(session)

        async def let_go(claim: RunClaimed = claim, token: str = token) -> None:
            # paused as it was, for a later resume (a no-op once let go: fenced by the token)
            await client.save_run(session, token, done=False, framework=claim.framework,
                                  state=claim.state, calls=claim.calls.encode())

        try:
            if claim.framework != fw.extra:
                raise InvalidInput("agent", f"session {session!r}'s run was paused by the "
                                   f"{claim.framework} adapter, not {fw.extra}")
            calls: list[dict[str, Any]] = orjson.loads(claim.calls)
            waiting = await _waiting(client, session, calls)
            if waiting:
                await let_go()
                if time.monotonic() >= deadline:
                    return AgentRun("paused", None, waiting, session)
                await _until_decided(client, session, waiting, deadline)
                continue
            outcomes, applied = await _outcomes(client, session, calls, claim.outcomes)
            running = Running(client, session, tenant, outcomes, applied)
            return await _go(fw, agent, running, token,
                             functools.partial(fw.cont, agent, claim.state, session, options),
                             options)
        except BaseException:
            await let_go()
            raise


async def _within(running: Running, step: Awaitable[Step]) -> Step:
    reset = _running.set(running)
    try:
        return await step
    finally:
        _running.reset(reset)


async def _go(fw: Framework, agent: Any, running: Running, token: str,
              first: Callable[[], Awaitable[Step]], options: dict[str, Any]) -> AgentRun:
    """Run the framework while holding the run's lease, and keep what it came to: done (the
    run's record goes), or paused (each call staged, then the framework's state kept with the
    calls, before anything says paused). Calls staged by an attempt that fails before its save
    are discarded again: no run would ever come back for them."""
    pa, session = running.pa, running.session
    staged: list[str] = []
    async with _Held(running, token):
        try:
            step = await _within(running, first())
            while True:
                if isinstance(step, Done):
                    await pa.save_run(session, token, done=True)
                    return AgentRun("done", step.output, [], session)
                calls = [await _staged_call(running, fw, call, staged) for call in step.calls]
                waiting = [c["id"] for c in calls if c["id"]]
                if waiting:
                    break
                # every paused call was refused as it was staged: the framework goes on
                running.outcomes.update({c["call"]: c["text"] for c in calls})
                step = await _within(running, fw.cont(agent, step.state, session, options))
            if not await pa.save_run(session, token, done=False, framework=fw.extra,
                                     state=step.state, calls=orjson.dumps(calls)):
                raise NotPaused(session, busy=True)  # held past its lease, and taken over
        except BaseException:
            await _abandon(running, staged)
            raise
    return AgentRun("paused", None, waiting, session)


class _Held:
    """The run's lease held while the framework works: renewed every third of ``RUN_LEASE_S``
    (a continuation may take longer than one lease and still be the only one). A renewal that
    finds the lease taken over (this process stalled past it) stops the work here: the task is
    cancelled and raises ``NotPaused`` (busy), and nothing it staged stays."""

    def __init__(self, running: Running, token: str) -> None:
        self.running, self.token = running, token
        self.lost = False
        self.owner = asyncio.current_task()
        self.renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        self.renewer = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        pa, every = self.running.pa, self.running.pa.settings.run_lease_s / 3
        while True:
            await asyncio.sleep(every)
            try:
                held = await pa.renew_run(self.running.session, self.token)
            except PendingActionsError:
                continue  # Redis away for a moment: the save that ends the work is fenced
            if not held:
                self.lost = True
                if self.owner is not None:
                    self.owner.cancel()
                return

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        assert self.renewer is not None
        self.renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.renewer
        if self.lost and kind is asyncio.CancelledError and self.owner is not None:
            self.owner.uncancel()
            raise NotPaused(self.running.session, busy=True) from exc


async def _abandon(running: Running, staged: list[str]) -> None:
    """Discard the calls an attempt staged before it failed (newest first, each only while it
    is its session's head). What cannot be discarded now (no worker, Redis away) expires with
    ``RUN_TTL_S``."""
    for action_id in reversed(staged):
        with contextlib.suppress(PendingActionsError):
            await running.pa.resolve(session=running.session, action="discard",
                                     reason="its agent run failed before it paused",
                                     expect_id=action_id, timeout=5, tenant=running.tenant)


async def _staged_call(running: Running, fw: Framework, call: ToolCall,
                       staged: list[str]) -> dict[str, Any]:
    """A paused call as its run's record keeps it: staged (``id``), or refused as it was
    staged (``text``: what the model is given)."""
    tool = _TOOLS.get((fw.extra, call.tool))
    if tool is None:
        raise InvalidInput("tool", f"the run paused on {call.tool!r}, which is no staged tool "
                           f"of this process ({fw.extra}): no worker could apply it")
    kept = {"call": call.call_id, "tool": call.tool, "label": label(call.tool, call.arguments)}
    action_id = running.staged.get(call.call_id)
    if action_id is None:
        # staged in the context the call was decided in: the framework's span is its parent
        context = running.contexts.get(call.call_id, contextvars.copy_context())
        try:
            action_id = await asyncio.create_task(
                running.stage(tool, call.call_id, call.arguments), context=context)
        except Denied as exc:
            return {**kept, "id": "", "text": refusal(exc)}
        running.staged[call.call_id] = action_id
        staged.append(action_id)
    return {**kept, "id": action_id}


async def _waiting(pa: AsyncPendingActions, session: str,
                   calls: list[dict[str, Any]]) -> list[str]:
    """The ids of ``calls`` still pending or being applied."""
    live = {a.id for a in await pa.pending(session)}
    return [c["id"] for c in calls if c["id"] and c["id"] in live]


async def _until_decided(pa: AsyncPendingActions, session: str, waiting: list[str],
                         deadline: float) -> None:
    """Back once none of ``waiting`` is pending any more, or at ``deadline``."""
    pause = 0.05
    while time.monotonic() < deadline:
        await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        live = {a.id for a in await pa.pending(session)}
        if not live.intersection(waiting):
            return
        pause = min(pause * 2, 1.0)


async def _outcomes(pa: AsyncPendingActions, session: str, calls: list[dict[str, Any]],
                    noted: dict[str, str]) -> tuple[dict[str, str], set[str]]:
    """What each call, no longer pending, gives the model: the result a worker noted for an
    applied one, the discard's text, or what else ended it (from the session's history); and
    the calls applied."""
    out: dict[str, str] = {}
    applied: set[str] = set()
    ended: dict[str, dict[str, Any]] | None = None
    for c in calls:
        if not c["id"]:
            out[c["call"]] = c["text"]
        elif c["id"] in noted:
            out[c["call"]] = noted[c["id"]]
            applied.add(c["call"])
        else:
            if ended is None:
                ended = {e["id"]: e for e in await pa.history(session, count=10_000)
                         if e.get("id") and _ends(e.get("event", ""))}
            entry = ended.get(c["id"])
            out[c["call"]] = _ended_text(entry, c["label"])
            if entry is not None and entry["event"] == Event.APPLIED:
                applied.add(c["call"])
    return out, applied


def _ends(event: str) -> bool:
    try:
        return Event(event).fate is Fate.END
    except ValueError:
        return False


def _ended_text(entry: dict[str, Any] | None, shown: str) -> str:
    if entry is None:
        return (f"The outcome of {shown} is no longer known (the session's history was "
                "trimmed since); treat it as not done.")
    event, error = entry["event"], entry.get("error")
    if error:
        return str(error)
    if event == Event.DISCARDED:
        return texts.done("discard", shown, entry.get("reason", ""))
    if event == Event.APPLIED:
        return f"Applied: {shown}. Its result was not kept."
    if event == Event.EXPIRED:
        return f"Expired: {shown} was not resolved in time. Nothing was run."
    if event == Event.DEAD_LETTERED:
        return (f"Failed: {shown} stopped its worker every time it was applied and was set "
                "aside for an operator. Nothing more will run.")
    return f"{event.capitalize()}: {shown}."


class _client:
    """The caller's client, or one made from the settings for this call (and closed)."""

    def __init__(self, pa: AsyncPendingActions | None) -> None:
        self.given = pa
        self.made: AsyncPendingActions | None = None

    async def __aenter__(self) -> AsyncPendingActions:
        if self.given is not None:
            return self.given
        self.made = AsyncPendingActions()
        return self.made

    async def __aexit__(self, *exc: object) -> None:
        if self.made is not None:
            await self.made.close()
