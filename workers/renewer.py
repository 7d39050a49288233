"""The lease renewer of a dramatiq process: every running attempt's lease extended every
lease/3, so that a handler that runs long keeps it, and one whose process died loses it."""

from __future__ import annotations

import logging
import threading

from pending_actions.broker.backoff import Backoff
from pending_actions.broker.context import Context
from pending_actions.broker.failures import poison_of
from pending_actions.broker.loops import Beats, Loop

log = logging.getLogger("pending_actions.attempt")


class Renewer:
    """Extends the lease of every running attempt of this process, every lease/3: a loop of
    ``broker.loops`` (it beats, and survives every error, Redis full included)."""

    def __init__(self, ctx: Context, beats: Beats | None = None) -> None:
        self.ctx = ctx
        self.beats = beats
        self.tokens: dict[str, str] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self.lock:
            if self.thread is not None:
                return
            lease_s = self.ctx.settings.lease_ms / 1000
            # a renewal late by a lease loses the lease: back off at most a sixth of one
            loop = Loop("lease-renewer", self._renew, self.wake, pause_s=lease_s / 3,
                        every_s=lease_s, beats=self.beats, backoff=Backoff(0.02, lease_s / 6))
            self.thread = loop.thread()
            self.thread.start()

    def add(self, session: str, token: str) -> None:
        with self.lock:
            self.tokens[token] = session
        self.start()

    def discard(self, token: str) -> None:
        with self.lock:
            self.tokens.pop(token, None)

    def _renew(self) -> None:
        with self.lock:
            items = list(self.tokens.items())
        if not items:
            return
        ctx = self.ctx
        pipe = ctx.client.pipeline(transaction=False)
        # renew.lua moves the lease's index entry too
        renewals = [ctx.scripts.renew(session, token=token).on(pipe) for token, session in items]
        replies = pipe.execute(raise_on_error=False)
        failed = [r for r in replies if isinstance(r, Exception)]
        for (token, session), queued in zip(items, renewals, strict=True):
            if poison_of(replies[queued.index]) is not None:
                # recovery parks it when it comes due; renewing it again cannot help
                log.error("lease %s of %s does not parse; no longer renewed", token, session)
                self.discard(token)
        if failed and any(poison_of(r) is None for r in failed):
            raise next(r for r in failed if poison_of(r) is None)
