"""Webhooks: every stage and every outcome POSTed to the configured URLs, signed.

This module is what a receiver needs (``verify``) and imports nothing heavy; the delivery side
(the dramatiq actors and the dispatcher) is ``pending_actions.webhooks.delivery``.

Signature: ``X-Pending-Actions-Signature: sha256=<hex>`` where hex is HMAC-SHA256 with the
shared secret of ``<timestamp>.<body>``, and ``X-Pending-Actions-Timestamp`` is that Unix time
in seconds. A receiver recomputes it (``verify``) and refuses stale timestamps, so a captured
request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

SIGNATURE = "X-Pending-Actions-Signature"
TIMESTAMP = "X-Pending-Actions-Timestamp"
DELIVERY = "X-Pending-Actions-Delivery"
TOLERANCE_S = 300


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, headers: Mapping[str, str], body: bytes, *,
           tolerance_s: float = TOLERANCE_S, now: float | None = None) -> bool:
    """What a receiver runs: the signature matches and the timestamp is recent."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        timestamp = int(lowered.get(TIMESTAMP.lower(), ""))
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body)
    return hmac.compare_digest(expected, lowered.get(SIGNATURE.lower(), ""))
