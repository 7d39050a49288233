"""What a handler's run comes to, decided in one place (``workers.attempt.conclusion``): the
table of it, for each way a run ends and each kind of target. The scripts' effects (readd.lua,
finalize.lua) are tested with real workers elsewhere (test_contract, test_hardening)."""

from __future__ import annotations

from typing import Literal

import pytest

from pending_actions.broker.events import Event
from pending_actions.broker.models import ResolveAction, Spec
from pending_actions.broker.results import text_result
from pending_actions.workers.attempt import Ran, conclusion


def _spec(kind: str) -> Spec:
    return Spec.model_validate({"id": f"{kind}:t:1", "kind": kind, "label": "L",
                                "apply": "t.ok", "payload": {"n": 1}, "created_at": 1.0})


@pytest.mark.parametrize(("how", "kind", "action", "event", "readd"), [
    ("raised", "action", "apply", Event.FAILED, True),  # back on the stack's head
    ("raised", "standing", "apply", Event.FAILED, True),  # stays in its slot
    ("raised", "directive", "apply", Event.FAILED, False),  # used up: one shot
    ("stale", "action", "apply", Event.STALE, False),
    ("returned", "action", "apply", Event.APPLIED, False),
    ("returned", "action", "discard", Event.DISCARDED, False),
    ("returned", "directive", "discard", Event.DISCARDED, False),
])
def test_how_a_run_ends_decides_the_outcome(
        how: Literal["returned", "raised", "stale"], kind: str, action: ResolveAction,
        event: Event, readd: bool) -> None:
    ran = Ran(text_result("done", {}), how)
    end = conclusion(ran, _spec(kind), action)
    assert (end.event, end.readd, end.noted) == (event, readd, ())


def test_the_history_entry_notes_an_error_result_and_an_edit() -> None:
    ran = Ran(text_result("no such file", {}, is_error=True), "returned")
    end = conclusion(ran, _spec("action"), "apply", {"n": 2})
    assert (end.event, end.readd) == (Event.APPLIED, False)  # an error result is returned
    assert end.noted == ("error", "no such file", "edit", '{"n":2}', "payload", '{"n":1}')
