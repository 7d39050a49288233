"""Fingerprints of what a preview was computed from, for ``stage(fingerprint=)``: the producer
takes one when it previews, the handler takes one again before it applies, and raises
``Stale`` when they differ."""

from __future__ import annotations

import hashlib
from pathlib import Path

ABSENT = "sha256:absent"  # the fingerprint of a file that does not exist (yet)


def file_fingerprint(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as ``sha256:<hex>``."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return ABSENT
    return text_fingerprint(data)


def text_fingerprint(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return "sha256:" + hashlib.sha256(raw).hexdigest()
