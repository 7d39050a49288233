"""The dramatiq side on RabbitMQ, chosen by URL. Skipped where no RabbitMQ answers on
127.0.0.1:5672 (this machine kind runs one; the suite does not start it)."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from pending_actions.broker.texts import NOTHING_TO_APPLY
from tests.support.faults import cluster

RABBIT = "amqp://guest:guest@127.0.0.1:5672/"


def rabbit_up() -> bool:
    try:
        import pika  # noqa: F401
    except ImportError:
        return False
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not rabbit_up(), reason="no RabbitMQ on 127.0.0.1:5672 or pika missing")
def test_service_on_rabbitmq(tmp_path: Path) -> None:
    queue = f"pa-test-{uuid.uuid4().hex[:8]}"  # the machine's RabbitMQ is shared
    try:
        run_on_rabbit(tmp_path, queue)
    finally:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(RABBIT))
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            conn.channel().queue_delete(name)
        conn.close()


def run_on_rabbit(tmp_path: Path, queue: str) -> None:
    with cluster(tmp_path, dramatiq_url=RABBIT, queue=queue) as (_server, _workers, pa):
        first = pa.stage(session="s", tool="edit", label="A", apply="t.ok")
        pa.stage(session="s", tool="edit", label="B", apply="t.toolerror")
        failed = pa.resolve(session="s", action="apply", reason="r")
        assert (failed.is_error, failed.text) == (True, "refused: no reason")
        assert pa.resolve(session="s", action="discard", reason="r").text == \
            "Discarded: B. Reason: r"
        done = pa.resolve(session="s", action="apply", reason="r")
        assert (done.is_error, done.text) == (False, f"applied {first}")
        assert pa.pending("s") == []
        assert pa.resolve(session="s", action="apply", reason="r").text == NOTHING_TO_APPLY
