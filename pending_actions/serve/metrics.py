"""Prometheus metrics of ``serve``, with the official client.

Scoped: ``render(tenant)`` gives one tenant's series only (what an admin token reads on
``/metrics``: no other tenant's label value appears at all, and the deployment-wide figures,
which add up every tenant's work, are left out); ``render(None)`` gives everything, for the
operator listener (``serve --metrics-port``).

Two sources. Gauges are read from Redis at each scrape (``views.figures``): what is pending, in
flight, dead, how old the oldest is, and whether the loops of the workers are reading. Counters
and histograms of what happened (outcomes, time to decision, lease stalls) come from the
deployment's event feed (every partition's), which this process tails from the moment it
starts: like any Prometheus counter they start at zero with the process, and ``rate()`` takes
care of restarts.
Resolve latency is measured here, around each resolve made through the API.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.events import ENDINGS, OUTCOMES, Event
from pending_actions.broker.feed import Feeds
from pending_actions.broker.keys import Keys
from pending_actions.broker.models import Result
from pending_actions.producers import PendingActions
from pending_actions.serve.http import Outage
from pending_actions.views import figures

CONTENT_TYPE = CONTENT_TYPE_LATEST
# from a click in the inbox (seconds) to an agent left waiting for a day
DECISION_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, float("inf"))
# what a tenant's scrape shows besides its own series: nothing about other tenants
TENANT_NEUTRAL = {"pending_actions_redis_up"}


class TenantView(Collector):
    """A registry's metrics as one tenant sees them: the families with a ``tenant`` label,
    only that tenant's samples, and the neutral ones; every deployment-wide figure left out."""

    def __init__(self, registry: CollectorRegistry, tenant: str) -> None:
        self.registry = registry
        self.tenant = tenant

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.name in TENANT_NEUTRAL:
                yield family
                continue
            if not _per_tenant(family):
                continue
            mine = Metric(family.name, family.documentation, family.type, family.unit)
            mine.samples = [x for x in family.samples if x.labels.get("tenant") == self.tenant]
            yield mine


def _per_tenant(family: Metric) -> bool:
    """A family is per tenant when its samples carry the label; an empty family is judged by
    its name (a gauge with no sample yet still declares what it is)."""
    if family.samples:
        return all("tenant" in x.labels for x in family.samples)
    return family.name in PER_TENANT_FAMILIES


PER_TENANT_FAMILIES = {
    "pending_actions_pending", "pending_actions_in_flight", "pending_actions_dead_letters",
    "pending_actions_oldest_pending_age_seconds", "pending_actions_outcomes",
    "pending_actions_staged", "pending_actions_lease_stalls",
    "pending_actions_time_to_decision_seconds", "pending_actions_resolve_seconds",
    "pending_actions_policy"}


class RedisFigures(Collector):
    """Gauges read at scrape time."""

    def __init__(self, pa: PendingActions, outage: Outage) -> None:
        self.pa = pa
        self.outage = outage

    def collect(self) -> Iterator[Metric]:
        try:
            f = figures(self.pa)
            loops = self._loops()
        except TRANSIENT as exc:
            self.outage.failed(exc)
            up = GaugeMetricFamily("pending_actions_redis_up", "Redis answered this scrape")
            up.add_metric([], 0)
            yield up
            return
        self.outage.ok()
        up = GaugeMetricFamily("pending_actions_redis_up", "Redis answered this scrape")
        up.add_metric([], 1)
        yield up
        pending = GaugeMetricFamily("pending_actions_pending", "Pending actions (stacked, not "
                                    "in flight)", labels=["tenant", "tool"])
        for (tenant, tool), n in sorted(f.pending.items()):
            pending.add_metric([tenant, tool], n)
        yield pending
        gauges: tuple[tuple[str, str, dict[str, int]], ...] = (
            ("pending_actions_in_flight", "Actions leased to a running attempt", f.in_flight),
            ("pending_actions_dead_letters", "Dead-lettered actions kept", f.dead))
        for name, doc, counts in gauges:
            family = GaugeMetricFamily(name, doc, labels=["tenant"])
            for tenant, n in sorted(counts.items()):
                family.add_metric([tenant], n)
            yield family
        oldest = GaugeMetricFamily("pending_actions_oldest_pending_age_seconds",
                                   "Age of the oldest pending action", labels=["tenant"])
        for tenant in sorted(f.oldest):
            oldest.add_metric([tenant], f.oldest_age(tenant))
        yield oldest
        for name, doc, value in (
                ("pending_actions_sessions", "Sessions known", f.sessions),
                ("pending_actions_requests_waiting", "Resolve requests not yet read",
                 f.requests_waiting),
                ("pending_actions_tasks_queued", "Handler tasks in the queue", f.tasks_queued),
                ("pending_actions_leases", "Live leases (attempts dispatched or running)",
                 f.leases),
                ("pending_actions_leases_overdue", "Leases past their deadline, not yet "
                 "recovered: a worker stalled or died", f.leases_overdue)):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        idle = GaugeMetricFamily(
            "pending_actions_loop_idle_seconds", "Time since each live worker loop last read "
            "its stream (a loop that reads is alive)", labels=["group", "consumer"])
        alive = GaugeMetricFamily(
            "pending_actions_loops", "Worker loops by whether they read within their interval",
            labels=["group", "state"])
        for group, consumers in loops.items():
            alive_counts = {"live": 0, "silent": 0}
            for name, seconds, live in consumers:
                alive_counts["live" if live else "silent"] += 1
                if live:
                    idle.add_metric([group, name], seconds)
            for state, n in alive_counts.items():
                alive.add_metric([group, state], n)
        yield idle
        yield alive

    def _loops(self) -> dict[str, list[tuple[str, float, bool]]]:
        """Every consumer of the request and task streams with its idle time: a resolve loop
        re-reads every block_ms, a dramatiq consumer every second, so one silent for three
        intervals is stuck or dead (dead ones stay listed until their group is trimmed)."""
        k, s = self.pa.ctx.keys, self.pa.settings
        parts = range(k.partitions)
        pools = self.pa.live.get().pools
        out: dict[str, list[tuple[str, float, bool]]] = {}
        for group, streams, group_name, interval_ms in (
                ("resolver", [k.requests(p) for p in parts], Keys.RESOLVER_GROUP, s.block_ms),
                ("dramatiq", [k.task_queue(p, pool) for p in parts for pool in pools],
                 Keys.TASK_GROUP, 1000)):
            pipe = self.pa.client.pipeline(transaction=False)
            for stream in streams:
                pipe.xinfo_consumers(stream, group_name)
            # a consumer reads several partitions' streams: its idle time is its freshest read
            idle: dict[str, int] = {}
            for consumers in pipe.execute(raise_on_error=False):
                if isinstance(consumers, redis.ResponseError):  # no stream or group yet
                    continue
                for c in consumers:
                    name = c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
                    idle[name] = min(idle.get(name, c["idle"]), c["idle"])
            out[group] = [(name, ms / 1000, ms < 3 * interval_ms) for name, ms in idle.items()]
        return out


class Metrics:
    def __init__(self, pa: PendingActions, outage: Outage) -> None:
        """``outage``: where a failure to reach Redis is noted (one log line per outage)."""
        self.pa = pa
        self.outage = outage
        self.registry = CollectorRegistry()
        self.registry.register(RedisFigures(pa, outage))
        self.outcomes = Counter("pending_actions_outcomes", "Outcomes seen since this server "
                                "started", ["kind", "tenant"], registry=self.registry)
        self.staged = Counter("pending_actions_staged", "Actions staged since this server "
                              "started", ["tenant"], registry=self.registry)
        self.stalls = Counter("pending_actions_lease_stalls", "Leases that expired and were "
                              "recovered (a worker died or stalled)", ["tenant"],
                              registry=self.registry)
        self.decision = Histogram(
            "pending_actions_time_to_decision_seconds", "From stage to the final outcome",
            ["tenant", "outcome"], buckets=DECISION_BUCKETS, registry=self.registry)
        self.policy = Counter(
            "pending_actions_policy", "What tenants' policies did, per rule: denied a stage, "
            "asked people (staged for approval), recorded a person's approval (approved: one "
            "that was not the last)", ["tenant", "rule", "event"], registry=self.registry)
        self.resolve_latency = Histogram(
            "pending_actions_resolve_seconds", "Resolve through this API, request to result",
            ["tenant", "action", "result"], registry=self.registry)
        for kind in OUTCOMES:
            self.outcomes.labels(kind, "default")
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._tenants: dict[str, str] = {}

    def render(self, tenant: str | None) -> bytes:
        """``tenant``'s series only; None: every series (the operator listener)."""
        if tenant is None:
            return generate_latest(self.registry)
        return generate_latest(TenantView(self.registry, tenant))

    def observe_resolve(self, tenant: str, action: str, result: Result,
                        seconds: float) -> None:
        kind = "conflict" if result.is_error and "expect_id" in result.details else \
            "error" if result.is_error else "ok"
        self.resolve_latency.labels(tenant, action, kind).observe(seconds)

    def observe_event(self, fields: dict[str, str]) -> None:
        event = fields.get("event", "")
        tenant = fields.get("tenant") or self._tenant(fields.get("session", ""))
        rule = fields.get("rule") or "(default)"
        if event == Event.DENIED:
            self.policy.labels(tenant, rule, "denied").inc()
        elif event == Event.APPROVED:
            self.policy.labels(tenant, rule, "approved").inc()
        if event == Event.STAGED:
            self.staged.labels(tenant).inc()
            if fields.get("decision") == "ask":
                self.policy.labels(tenant, rule, "asked").inc()
        elif event == Event.RECOVERED:
            self.stalls.labels(tenant).inc()
        elif event in OUTCOMES:  # late-refused too: an outcome published, then refused as late
            self.outcomes.labels(event, tenant).inc()
            created, at = fields.get("created_at"), fields.get("at")
            if event in ENDINGS and created and at:
                self.decision.labels(tenant, event).observe(
                    max(0.0, float(at) - float(created)))

    def _tenant(self, session: str) -> str:
        """Recovery's entries name no tenant (it has no spec at hand): look it up, once."""
        if session not in self._tenants:
            k = self.pa.ctx.keys  # not tenant_of(): a feed entry's session is not checked
            raw: Any = self.pa.client.hget(k.sessions(k.partition(session)), session) \
                if session else None
            tenant = raw.decode() if raw else None
            if len(self._tenants) > 10_000:
                self._tenants.clear()
            self._tenants[session] = tenant or "-"
        return self._tenants[session]

    # --- the event feed -------------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(target=self._tail, name="metrics-feed", daemon=True)
        self.thread.start()

    def _tail(self) -> None:
        feeds = Feeds(self.pa.client, self.pa.ctx.keys)
        last: dict[int, str] | None = None
        outage = self.outage
        while not self.stop.is_set():
            try:
                if last is None:  # "now" as ids, once, so no event falls between reads
                    last = feeds.newest()
                for p, entry_id, fields in feeds.read(last, 500, 1000, self.stop):
                    # (a recovery's entry looks its tenant up: Redis may fail there too)
                    self.observe_event(fields)
                    last[p] = entry_id
            except TRANSIENT as exc:
                outage.failed(exc)
                self.stop.wait(1.0)
                continue
            outage.ok()
