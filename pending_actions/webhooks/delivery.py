"""Webhook delivery: the event feed (every partition's ``Keys.events``, ``broker.feed.Feeds``) is
read through a consumer group (one per partition's stream) by a thread in each dramatiq worker
process that imports this module (``worker`` and ``up`` do when
``PENDING_ACTIONS_WEBHOOK_URLS`` is set); each event becomes one dramatiq task per URL, retried
with exponential backoff. A delivery that runs out of retries is recorded in
``Keys.webhooks_dead`` with its last error (and dramatiq parks the message as usual). Signing is
in ``pending_actions.webhooks``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import dramatiq
import orjson
import redis

from pending_actions.broker.connection import TRANSIENT
from pending_actions.broker.feed import Entry, Feeds
from pending_actions.broker.loops import Loop
from pending_actions.broker.settings import Settings
from pending_actions.webhooks import DELIVERY, SIGNATURE, TIMESTAMP, parse_urls, sign
from pending_actions.workers.actors import beats, broker, ctx

log = logging.getLogger("pending_actions.webhooks")
GROUP = "webhooks"


def urls(settings: Settings) -> list[str]:
    return parse_urls(settings.webhook_urls)


def _opener() -> urllib.request.OpenerDirector:
    """http and https only, and no redirect handler: a 3xx reaches the default error handler
    and is raised as an HTTPError, a failed delivery (never a signed event sent on to wherever
    a receiver points)."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.HTTPHandler(), urllib.request.HTTPSHandler(),
                    urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


OPENER = _opener()


QUEUE = f"{ctx.settings.queue}.webhooks"  # apart from handler runs, so a slow receiver
                                          # never delays an approval


@dramatiq.actor(actor_name="pending_actions.webhook_dead", queue_name=QUEUE, max_retries=3)
def dead_letter(message: dict[str, Any], info: dict[str, Any]) -> None:
    kwargs = message.get("kwargs", {})
    ctx.client.xadd(ctx.keys.webhooks_dead, {
        "url": kwargs.get("url", ""), "event": orjson.dumps(kwargs.get("event")),
        "error": str(message.get("options", {}).get("last_error", ""))[:500],
        "retries": info.get("retries", 0)}, maxlen=10_000, approximate=True)
    log.error("webhook to %s given up after %s retries", kwargs.get("url"), info.get("retries"))


@dramatiq.actor(actor_name="pending_actions.webhook", queue_name=QUEUE,
                max_retries=ctx.settings.webhook_retries,
                min_backoff=ctx.settings.webhook_min_backoff_ms,
                max_backoff=max(ctx.settings.webhook_min_backoff_ms, 3_600_000),
                on_retry_exhausted="pending_actions.webhook_dead")
def deliver(url: str, event: dict[str, Any], delivery: str) -> None:
    body = orjson.dumps(event)
    timestamp = int(time.time())  # signed at each try: a retry hours later is not "stale"
    headers = {"Content-Type": "application/json", TIMESTAMP: str(timestamp), DELIVERY: delivery,
               "User-Agent": "pending-actions-webhook"}
    if ctx.settings.webhook_secret:
        headers[SIGNATURE] = sign(ctx.settings.webhook_secret, timestamp, delivery, body)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with OPENER.open(request, timeout=ctx.settings.webhook_timeout_s) as reply:
            reply.read()
    except (urllib.error.URLError, OSError) as exc:
        from dramatiq.middleware import CurrentMessage

        current = CurrentMessage.get_current_message()
        if current is not None:  # for the dead letter, should this be the last try
            current.options["last_error"] = str(exc)
        raise RuntimeError(f"webhook {url}: {exc}") from exc


class Dispatcher(dramatiq.Middleware):
    """Turns the event feed into delivery tasks, in every dramatiq process; the consumer group
    gives each event to one of them, and one that dies leaves its events to be claimed."""

    CLAIM_IDLE_MS = 30_000

    def __init__(self) -> None:
        self.stop = threading.Event()

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        if urls(ctx.settings):
            threading.Thread(target=self._run, name="webhook-dispatch", daemon=True).start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self.stop.set()

    def _run(self) -> None:
        consumer = f"{os.getpid()}-{threading.get_ident()}"
        next_claim = [0.0]
        grouped = [False]

        def step() -> None:
            if not grouped[0]:
                FEEDS.ensure_group(GROUP)
                grouped[0] = True
            entries: list[Entry] = []
            try:
                if time.monotonic() >= next_claim[0]:
                    next_claim[0] = time.monotonic() + self.CLAIM_IDLE_MS / 2000
                    entries = FEEDS.claim(GROUP, consumer, self.CLAIM_IDLE_MS, 100)
                if not entries:
                    entries = FEEDS.read_group(GROUP, consumer, 100, 1000, self.stop)
            except redis.ResponseError as exc:
                # a feed deleted (its group with it): made again at the next step
                grouped[0] = grouped[0] and "NOGROUP" not in str(exc)
                raise
            self.dispatch(entries)

        # a loop of broker.loops: survives every error (a deleted feed included), beats
        Loop("webhook-feed", step, self.stop, every_s=15.0, beats=beats).run()

    def dispatch(self, entries: list[Entry]) -> None:
        if not entries:
            return
        targets = urls(ctx.settings)
        for p, entry_id, event in entries:
            for n, url in enumerate(targets):
                # at least once: a crash before the ack re-sends; the delivery id (an entry id
                # is its partition's: the partition goes with it) lets the receiver drop
                # duplicates
                deliver.send(url=url, event=event, delivery=f"{p}:{entry_id}/{n}")
        FEEDS.ack(GROUP, entries)


FEEDS = Feeds(ctx.client, ctx.keys)
# at import, before this process says it is ready: every event staged after a worker is ready
# is delivered (the dispatcher thread retries this while Redis is away)
with contextlib.suppress(*TRANSIENT):
    FEEDS.ensure_group(GROUP)
broker.add_middleware(Dispatcher())
