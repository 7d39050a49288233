"""Webhooks: every stage and every outcome POSTed to the configured URLs, signed.

This module is what a receiver needs (``verify``) and imports nothing heavy; the delivery side
(the dramatiq actors and the dispatcher) is ``pending_actions.webhooks.delivery``.

Signature: ``X-Pending-Actions-Signature: sha256=<hex>`` where hex is HMAC-SHA256 with the
shared secret of ``<timestamp>.<delivery>.<body>``: ``X-Pending-Actions-Timestamp`` is that
Unix time in seconds and ``X-Pending-Actions-Delivery`` the delivery's id. A receiver
recomputes it (``verify``) and refuses stale timestamps, so a captured request cannot be
replayed later, nor replayed now under another delivery id to slip past the receiver's
duplicate check.

Only http and https URLs are accepted (``parse_urls``, checked when a worker starts), and a
receiver's redirect is never followed: a 3xx is a failed delivery, retried like a 5xx. A
redirect would otherwise carry the signed event to wherever the receiver points, an address
inside the network included.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from pending_actions.broker.errors import ConfigError

SIGNATURE = "X-Pending-Actions-Signature"
TIMESTAMP = "X-Pending-Actions-Timestamp"
DELIVERY = "X-Pending-Actions-Delivery"
TOLERANCE_S = 300


def parse_urls(text: str | None) -> list[str]:
    """The comma-separated webhook URLs of ``PENDING_ACTIONS_WEBHOOK_URLS``; ConfigError naming
    the first that is not an http(s) URL with a host."""
    found = [u.strip() for u in (text or "").split(",") if u.strip()]
    for url in found:
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 (a port that is no number raises here)
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"PENDING_ACTIONS_WEBHOOK_URLS: {url!r} is not an http:// or "
                              "https:// URL with a host")
    return found


def signed_text(timestamp: int, delivery: str, body: bytes) -> bytes:
    """What the signature covers: the time, the delivery id and the body."""
    return f"{timestamp}.{delivery}.".encode() + body


def sign(secret: str, timestamp: int, delivery: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), signed_text(timestamp, delivery, body), hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, headers: Mapping[str, str], body: bytes, *,
           tolerance_s: float = TOLERANCE_S, now: float | None = None) -> bool:
    """What a receiver runs: the signature matches the body, the timestamp and the delivery
    id the request carries, and the timestamp is recent."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        timestamp = int(lowered.get(TIMESTAMP.lower(), ""))
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    delivery = lowered.get(DELIVERY.lower())
    if not delivery:
        return False
    expected = sign(secret, timestamp, delivery, body)
    return hmac.compare_digest(expected, lowered.get(SIGNATURE.lower(), ""))
