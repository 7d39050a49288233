"""A plain in-memory model of CONTRACT section 2: what one process would do, as in the seed.
The model-based test drives it and the real service with the same steps and compares."""

from __future__ import annotations

from dataclasses import dataclass, field

from pending_actions.broker import texts

# apply behaviours -> the test handler that has it
APPLY = {"ok": "t.ok", "toolerror": "t.toolerror", "boom": "t.boom", "crash": "t.crash"}
REJECT = {None: None, "text": "t.reject_text", "raise": "t.reject_raise"}


@dataclass
class Entry:
    id: str
    label: str
    apply: str
    reject: str | None
    attempts: int = 0
    stalls: int = 0


@dataclass
class Session:
    stack: list[Entry] = field(default_factory=list)  # head last
    directive: Entry | None = None
    standing: Entry | None = None
    dead: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Expected:
    is_error: bool
    text: str
    label: str | None


class Model:
    def __init__(self, max_stalls: int) -> None:
        self.max_stalls = max_stalls
        self.sessions: dict[str, Session] = {}

    def s(self, name: str) -> Session:
        return self.sessions.setdefault(name, Session())

    def stage(self, session: str, entry: Entry) -> None:
        self.s(session).stack.append(entry)

    def pending_ids(self, session: str) -> list[str]:
        return [e.id for e in reversed(self.s(session).stack)]

    def next_choice(self, session: str) -> str | None:
        s = self.s(session)
        if s.directive:
            return s.directive.id
        return s.stack[-1].id if s.stack else None

    def resolve(self, session: str, action: str, reason: str) -> Expected:
        s = self.s(session)
        if s.directive:
            target, kind = s.directive, "directive"
        elif s.stack:
            target, kind = s.stack[-1], "action"
        elif s.standing:
            target, kind = s.standing, "standing"
        else:
            if action == "apply":
                return Expected(True, texts.NOTHING_TO_APPLY, None)
            return Expected(False, texts.NOTHING_TO_DISCARD, None)
        target.attempts += 1

        def consume() -> None:
            if kind == "directive":
                s.directive = None
            elif kind == "action":
                s.stack.pop()

        def failed(text: str) -> Expected:
            # a raised error keeps a stacked action pending; a directive is one shot: used up
            # by the first resolve through it, whatever the outcome
            if kind == "directive":
                consume()
            return Expected(True, text, target.label)

        if action == "discard":
            if target.reject == "raise":
                return failed("reject broke")
            consume()
            if target.reject == "text":
                return Expected(False, f"rejected {target.label} because {reason}", target.label)
            return Expected(False, texts.done(action, target.label, reason), target.label)
        if target.apply == "ok":
            consume()
            return Expected(False, f"applied {target.id}", target.label)
        if target.apply == "toolerror":
            return failed("refused: no reason")
        if target.apply == "boom":
            return failed(texts.handler_failed(action, "kaput"))
        # crash: the worker dies; the lease runs out; back on top, or dead past the limit
        target.stalls += 1
        if kind != "standing" and target.stalls >= self.max_stalls:
            consume()
            s.dead.append(target.id)
            return Expected(True, texts.dead_lettered(action, target.id, self.max_stalls),
                            target.label)
        return Expected(True, texts.worker_lost(action, target.attempts, target.id), target.label)
