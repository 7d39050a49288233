"""``pending-actions policy set/show/test`` as a user types them: a file set and shown, the
precedence explained (the deciding rule and every other that matched, with why it lost), a bad
policy one line naming the rule and the field (exit 2, the old policy kept), a YAML file set
(without PyYAML: tests/test_rules.py)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from pending_actions.procs import ROOT
from pending_actions.producers import PendingActions
from tests.conftest import Deployment, both
from tests.support.procs import worker_env

POLICY = {"default": "ask", "rules": [
    {"name": "reads", "match": {"tool": "read_*"}, "decision": "allow", "auto": True},
    {"name": "deploys", "match": {"tool": "deploy*"}, "decision": "ask", "approvals": 2},
    {"name": "prod-deploys", "match": {"tool": "deploy", "payload": {"env": "prod"}},
     "decision": "ask", "approvals": 3},
    {"name": "any-deploy", "match": {"tool": "deploy"}, "decision": "allow"},
    {"name": "frozen", "match": {"payload": {"freeze": True}}, "decision": "deny",
     "reason": "the release is frozen"},
    {"name": "writes", "match": {"apply": "fs.write*"}, "decision": "ask", "approvals": 2},
]}


@pytest.fixture(params=["single", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    return both(request)


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pending_actions", *args], env=worker_env(url),
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_set_show_and_test_explain_precedence(deployment: Deployment, pa: PendingActions,
                                              tmp_path: Path) -> None:
    url = deployment.url
    t = f"c-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "policy.json"
    path.write_bytes(orjson.dumps(POLICY))
    made = cli(url, "--json", "policy", "set", "--tenant", t, str(path))
    assert made.returncode == 0, made.stderr
    assert orjson.loads(made.stdout) == {"tenant": t, "version": 1}
    shown = cli(url, "policy", "show", "--tenant", t, "--json")
    assert orjson.loads(shown.stdout)["document"] == POLICY

    got = cli(url, "--json", "policy", "test", "--tenant", t, "--tool", "deploy",
              "--payload", '{"env": "prod"}')
    out = orjson.loads(got.stdout)
    assert (out["decision"], out["rule"], out["approvals"]) == ("ask", "prod-deploys", 3)
    assert {m["rule"]: m["why"] for m in out["matched"]} == {
        "deploys": "asks for 2 approval(s); prod-deploys asks for 3, the most",
        "any-deploy": "an ask wins over allow: prod-deploys asks"}
    got = cli(url, "--json", "policy", "test", "--tenant", t, "--tool", "deploy",
              "--payload", '{"env": "prod", "freeze": true}')
    out = orjson.loads(got.stdout)
    assert (out["decision"], out["rule"], out["reason"]) == ("deny", "frozen",
                                                              "the release is frozen")
    assert {m["why"] for m in out["matched"]} == {"any deny wins: frozen denies"}
    human = cli(url, "policy", "test", "--tenant", t, "--tool", "read_file")
    assert human.stdout.startswith("allow (auto): rule reads of version 1"), human.stdout
    fallback = cli(url, "--json", "policy", "test", "--tenant", t, "--tool", "email")
    assert (orjson.loads(fallback.stdout)["decision"],
            orjson.loads(fallback.stdout)["rule"]) == ("ask", None)
    # the reject handler is decided too: a read whose undo writes is no auto-apply
    both_ = cli(url, "--json", "policy", "test", "--tenant", t, "--tool", "read_file",
                "--apply", "fs.read", "--reject", "fs.write")
    out = orjson.loads(both_.stdout)
    assert (out["decision"], out["rule"], out["auto"]) == ("ask", "writes", False), both_.stdout
    assert [m["rule"] for m in out["matched"]] == ["reads"]

    bad = tmp_path / "bad.json"
    bad.write_bytes(orjson.dumps({"rules": [{"name": "oops", "match": {"tool": "[x"},
                                             "decision": "deny"}]}))
    refused = cli(url, "policy", "set", "--tenant", t, str(bad))
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "Traceback" not in refused.stderr
    assert "rules[0].match.tool" in refused.stderr and "oops" in refused.stderr, refused.stderr
    assert pa.get_policy(t)["version"] == 1  # type: ignore[index]

    yaml_file = tmp_path / "p.yaml"
    yaml_file.write_text("default: deny\nrules:\n  - {name: reads, match: {tool: 'read_*'}, "
                         "decision: allow}\n")
    said = cli(url, "policy", "set", "--tenant", t, str(yaml_file))
    assert said.returncode == 0, said.stderr
    assert pa.get_policy(t)["document"] == {  # type: ignore[index]
        "default": "deny", "rules": [{"name": "reads", "match": {"tool": "read_*"},
                                      "decision": "allow"}]}
    none = cli(url, "policy", "show", "--tenant", f"none-{t}")
    assert none.returncode == 1 and "has no policy" in none.stderr
