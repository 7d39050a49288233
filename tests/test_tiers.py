"""The tiers themselves (tests/support/tiers.py, docs/testing.md#tiers): what a test reaches
decides its tier, the audit fails a fast test that starts a process, and CI's Redis 6.2 run
is chosen by marker."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pending_actions.embedded import EmbeddedRedis
from pending_actions.procs import ROOT
from tests.support import faults
from tests.support.procs import Worker
from tests.support.tiers import AUDIT, Reader, tiers_of


def pure(n: int) -> int:
    return n + 1


def runs_a_command() -> None:
    subprocess.run(["true"], check=True)


def runs_python() -> list[str]:
    return [sys.executable, "-c", "pass"]


def starts_a_worker(url: str) -> Worker:
    return Worker(url)


def through_a_helper() -> None:
    pure(1)
    runs_a_command()


def on_a_cluster(tmp: Path) -> None:
    with faults.cluster(tmp, on_cluster=True):
        pass


def on_one_server(tmp: Path) -> None:
    with faults.cluster(tmp, on_cluster=False):
        pass


def own_redis(tmp: Path) -> EmbeddedRedis:
    return EmbeddedRedis(directory=tmp)


@pytest.mark.parametrize(("test", "expected"), [
    (pure, {"fast"}),
    (own_redis, {"fast"}),  # redis-server is the one process a fast test may start
    (runs_a_command, {"process"}),
    (runs_python, {"process"}),
    (starts_a_worker, {"process"}),
    (through_a_helper, {"process"}),
    (on_a_cluster, {"process", "cluster"}),
    (on_one_server, {"process"}),
])
def test_a_tier_is_what_a_test_reaches(test: object, expected: set[str]) -> None:
    assert tiers_of(Reader(), test, [], {}, dynamic=False) == expected


def test_a_fixture_and_a_parameter_count_as_the_test_itself() -> None:
    reader = Reader()
    assert tiers_of(reader, pure, [starts_a_worker], {}, dynamic=False) == {"process"}
    assert tiers_of(reader, pure, [], {"deployment": "cluster"}, dynamic=False) == {"cluster"}
    assert tiers_of(reader, pure, [], {"deployment": "single"}, dynamic=True) == {"process"}


def test_this_test_is_fast_and_audited(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None
    assert AUDIT.watching is not None  # (the conftest's wrapper set it for this test)


def test_the_audit_refuses_a_process_but_redis_server() -> None:
    outer = AUDIT.watching
    started: list[str] = []
    AUDIT.watching = started
    try:
        with pytest.raises(RuntimeError, match="marked fast started a process: true"):
            subprocess.run(["true"], check=True)
        server = shutil.which("redis-server")
        if server is not None:  # (else the tests start the wheel's, by its own name)
            subprocess.run([server, "--version"], check=True, capture_output=True)
    finally:
        AUDIT.watching = outer
    assert started == ["true"]


def test_a_fast_test_that_starts_a_process_fails(pytester: pytest.Pytester) -> None:
    """A test the reading takes for fast (a tier said by hand, or a process started through a
    library) fails when it starts one, even when it catches the refusal itself."""
    pytester.makeconftest("from tests.conftest import *  # noqa: F403")
    pytester.makepyfile(test_inner="""
        import subprocess
        import pytest

        @pytest.mark.fast
        def test_swallows():
            try:
                subprocess.run(["true"])
            except RuntimeError:
                pass

        @pytest.mark.process
        def test_may():
            subprocess.run(["true"], check=True)

        def test_pure():
            assert 1 + 1 == 2
    """)
    outer, AUDIT.watching = AUDIT.watching, None  # (the inner run's tests audit themselves)
    try:
        result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider",
                                              "-W", "ignore::pytest.PytestUnknownMarkWarning")
    finally:
        AUDIT.watching = outer
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*_ test_swallows _*", "marked fast, but started ?'true'?*"])


def test_ci_reruns_the_redis62_mark_on_6_2() -> None:
    """The second run of .ci/run selects by marker, and the marked files are what its comment
    and docs/testing.md describe: none is listed by hand there any more."""
    ci = (ROOT / ".ci" / "run").read_text()
    rerun = [line for line in ci.splitlines() if line.startswith("TEST_REDIS=wheel")]
    assert len(rerun) == 1, rerun
    assert '-m "redis62 and not cluster"' in rerun[0]
    assert not re.search(r"tests/\S+\.py", ci.split("TEST_REDIS=wheel", 1)[1])
    marked = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                    if re.search(r"^pytestmark = .*pytest\.mark\.redis62", path.read_text(),
                                 re.M))
    assert len(marked) >= 20, marked
    assert "tests/test_redis6.py" in marked and "tests/test_faults.py" in marked


def test_ci_runs_the_readmes_test_command_as_written() -> None:
    readme = (ROOT / "README.md").read_text()
    [command] = [line for line in readme.splitlines()
                 if line.startswith("python3 -m venv") and "pytest" in line]
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
