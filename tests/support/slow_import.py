"""A handler module that takes its time to import in a dramatiq worker process, as one that
loads a large model would: there it waits until the test pushes to ``RELEASE``. The worker's
import check (a plain process, no multiprocessing parent) passes at once, so the worker runs
and writes its id file while its dramatiq process is still importing."""

from __future__ import annotations

import multiprocessing
import os

import redis

from pending_actions.workers import handler

RELEASE = "test:slow-import:release"

if multiprocessing.parent_process() is not None:  # a dramatiq worker process
    with redis.Redis.from_url(os.environ["PENDING_ACTIONS_REDIS_URL"]) as _client:
        _client.blpop([RELEASE], timeout=120)


@handler("t.slow")
def slow(**_kwargs: object) -> str:
    return "slow handlers loaded"
