"""The handlers of ``tests.support.handlers``, in a worker whose dramatiq broker also has a
middleware that skips every task of the session ``skipped`` before its actor runs, as
dramatiq's own AgeLimit skips a message that is too old."""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.middleware import SkipMessage

import tests.support.handlers  # noqa: F401  (registers the handlers)

SESSION = "skipped"


class SkipSession(dramatiq.Middleware):
    def before_process_message(self, broker: Any, message: Any) -> None:
        if message.kwargs.get("session") == SESSION:
            raise SkipMessage()


dramatiq.get_broker().add_middleware(SkipSession())
