"""Outcomes are counted from ``Event`` alone: what each event means for its action (its fate)
decides what ``serve``'s metrics count and what the soak's tally calls an end."""

from __future__ import annotations

import uuid

import redis

from pending_actions.broker.events import ENDINGS, OUTCOMES, Event, Fate
from pending_actions.broker.keys import Keys
from pending_actions.embedded import EmbeddedRedis
from pending_actions.producers import PendingActions
from pending_actions.serve.http import Outage
from pending_actions.serve.metrics import Metrics
from pending_actions_harness.soak import Histories


def test_each_event_says_what_it_means_for_its_action() -> None:
    # the outcomes and ends as they were written out by hand before they came from the enum
    # (and denied, which policies added: a stage refused, never pending)
    assert [e.value for e in OUTCOMES] == ["applied", "discarded", "failed", "late-refused",
                                           "dead-lettered", "expired", "stale", "denied"]
    assert {e.value for e in ENDINGS} == {"applied", "discarded", "expired", "stale",
                                         "dead-lettered", "denied"}
    assert {e for e in Event if e.fate is Fate.RETRY} == {Event.FAILED, Event.LATE_REFUSED}
    # a stream entry's event is a plain string, found in them as it is
    assert "late-refused" in OUTCOMES and "applied" in ENDINGS and "taken" not in OUTCOMES
    assert Event("dead-lettered") is Event.DEAD_LETTERED and Event.STALE.value == "stale"


def test_metrics_count_every_outcome_and_time_every_end(redis_server: EmbeddedRedis) -> None:
    pa = PendingActions.from_url(redis_server.url)
    metrics = Metrics(pa, Outage("metrics"))
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    for event in Event:
        metrics.observe_event({"event": event.value, "tenant": tenant, "session": "s",
                               "created_at": "100.0", "at": "101.5"})
    text = metrics.render(None).decode()
    counted = {e.value for e in Event
               if f'pending_actions_outcomes_total{{kind="{e.value}",tenant="{tenant}"}} 1.0'
               in text}
    timed = {e.value for e in Event
             if f'pending_actions_time_to_decision_seconds_count{{outcome="{e.value}",'
                f'tenant="{tenant}"}} 1.0' in text}
    assert counted == {e.value for e in OUTCOMES}
    assert timed == {e.value for e in ENDINGS}
    assert f'pending_actions_staged_total{{tenant="{tenant}"}} 1.0' in text
    assert f'pending_actions_lease_stalls_total{{tenant="{tenant}"}} 1.0' in text
    pa.close()


def test_the_soak_tally_reads_each_end_and_nothing_else(redis_server: EmbeddedRedis) -> None:
    rc = redis.Redis.from_url(redis_server.url)
    session, keys = f"s-{uuid.uuid4().hex[:12]}", Keys()
    for event, action_id in [("staged", "a"), ("taken", "a"), ("failed", "a"),
                             ("late-refused", "a"), ("applied", "a"),
                             ("staged", "b"), ("recovered", "b"), ("dead-lettered", "b"),
                             ("staged", "c"), ("parked", "c")]:
        rc.xadd(keys.history(session), {"event": event, "id": action_id})
    found = Histories.read(rc, [session])
    assert found.staged == {"a", "b", "c"}
    assert found.outcomes == {"a": ["applied"], "b": ["dead-lettered"]}
    rc.delete(keys.history(session))
    rc.close()
