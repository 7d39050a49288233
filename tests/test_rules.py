"""broker/rules.py against a plain Python model of the rules (hypothesis): globs (a recursive
matcher over tokens, not a regex), dotted paths (a walk), precedence (a loop over the matching
rules); and the glob syntax docs/policies.md states, example by example."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.globs import (
    INDEX_DIGITS,
    MISSING,
    BadGlob,
    Glob,
    index_of,
    lookup,
    parse,
    parse_path,
)
from pending_actions.broker.rules import Policy, check_document, read_document

ALPHABET = "ab.*?[]!-/\\"

# --- the model -------------------------------------------------------------------------------
# a glob is a list of tokens: ("lit", c), ("any",), ("one",), ("set", negate, [(lo, hi), ...])
Token = tuple[Any, ...]


def render(tokens: list[Token]) -> str:
    """The glob text of ``tokens``: every literal and set member escaped with a backslash."""
    out = []
    for t in tokens:
        if t[0] == "lit":
            out.append("\\" + t[1] if t[1] in "*?[\\" else t[1])
        elif t[0] == "any":
            out.append("*")
        elif t[0] == "one":
            out.append("?")
        else:
            body = "".join("\\" + lo if lo == hi else f"\\{lo}-\\{hi}" for lo, hi in t[2])
            out.append(f"[{'!' if t[1] else ''}{body}]")
    return "".join(out)


def model_match(tokens: list[Token], text: str) -> bool:
    @cache
    def at(i: int, j: int) -> bool:
        if i == len(tokens):
            return j == len(text)
        t = tokens[i]
        if t[0] == "any":
            return any(at(i + 1, k) for k in range(j, len(text) + 1))
        if j == len(text):
            return False
        c = text[j]
        if t[0] == "lit":
            ok = c == t[1]
        elif t[0] == "one":
            ok = True
        else:
            inside = any(lo <= c <= hi for lo, hi in t[2])
            ok = inside != t[1]
        return ok and at(i + 1, j + 1)

    return at(0, 0)


chars = st.sampled_from(ALPHABET)
ranges = st.tuples(chars, chars).map(lambda p: (min(p), max(p)))
tokens = st.lists(st.one_of(
    st.tuples(st.just("lit"), chars), st.tuples(st.just("any")), st.tuples(st.just("one")),
    st.tuples(st.just("set"), st.booleans(), st.lists(ranges, min_size=1, max_size=3))),
    max_size=6)


@settings(max_examples=400, deadline=None)
@given(tokens, st.text(ALPHABET, max_size=8))
def test_globs_match_as_the_model_does(glob: list[Token], text: str) -> None:
    assert Glob(render(glob)).matches(text) == model_match(glob, text), render(glob)


def model_lookup(value: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and (part == "0" or part[0] != "0") \
                and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


keys = st.sampled_from(["a", "b", "0", "1", "x.y"])
leaves = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["s", "a", "1"]),
                   st.just(1.0))
payloads = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=8)
paths = st.lists(st.sampled_from(["a", "b", "0", "1", "01"]), min_size=1, max_size=3).map(
    ".".join)


def model_same(a: Any, b: Any) -> bool:
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(model_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(model_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, payloads, max_size=3), paths, st.one_of(leaves, st.just("s*")))
def test_payload_paths_match_as_the_model_does(payload: dict[str, Any], path: str,
                                               want: Any) -> None:
    policy = Policy({"rules": [{"name": "r", "match": {"payload": {path: want}},
                                "decision": "deny"}]})
    found, got = model_lookup(payload, path)
    if not found:
        expected = False
    elif isinstance(want, str):
        expected = isinstance(got, str) and model_match(
            [("any",) if c == "*" else ("lit", c) for c in want], got)
    else:
        expected = model_same(got, want)
    verdict = policy.decide(tool="t", apply="h", label="l", session="s", payload=payload)
    assert (verdict.decision == "deny") == expected


def test_a_digit_part_too_long_for_an_index_is_a_key() -> None:
    """A path part of 5,000 digits (past int()'s 4,300) is set and decided like any key: it
    names an object's key, and on a list it matches nothing; 9 digits still index."""
    digits = "7" * 5_000
    document = {"rules": [
        {"name": "key", "match": {"payload": {digits: "x*"}}, "decision": "deny"},
        {"name": "listed", "match": {"payload": {f"items.{digits}": "x"}}, "decision": "ask"}]}
    check_document(document)
    policy = Policy(document)

    def decide(payload: dict[str, Any]) -> str | None:
        return policy.decide(tool="t", apply="h", label="l", session="s", payload=payload).rule

    assert decide({digits: "xy"}) == "key"
    assert decide({digits: "y"}) is None
    assert decide({"items": {digits: "x"}}) == "listed"
    assert decide({"items": ["x"] * 3}) is None
    assert policy.explain(tool="t", apply="h", label="l", session="s",
                          payload={"items": ["x"]}).matched == []
    assert lookup({"a": ["x"]}, parse_path("a." + digits)) is MISSING
    assert lookup({"a": {digits: 1}}, parse_path("a." + digits)) == 1
    assert index_of("1" * INDEX_DIGITS) == int("1" * INDEX_DIGITS)
    assert index_of("1" * (INDEX_DIGITS + 1)) is None


rules = st.lists(st.tuples(st.sampled_from(["allow", "ask", "deny"]), st.integers(1, 4),
                           st.sampled_from(["*", "edit", "deploy", "e*", "d?ploy"]),
                           st.booleans()), max_size=8)


@settings(max_examples=400, deadline=None)
@given(rules, st.sampled_from(["allow", "ask", "deny"]),
       st.sampled_from(["edit", "deploy", "shell"]))
def test_precedence_is_the_models(specs: list[tuple[str, int, str, bool]], default: str,
                                  tool: str) -> None:
    document: dict[str, Any] = {"default": default, "rules": []}
    for i, (decision, approvals, pattern, auto) in enumerate(specs):
        rule: dict[str, Any] = {"name": f"r{i}", "match": {"tool": pattern},
                                "decision": decision}
        if decision == "ask":
            rule["approvals"] = approvals
        if decision == "allow" and auto:
            rule["auto"] = True
        document["rules"].append(rule)
    policy = Policy(document)
    matching = [r for r in document["rules"]
                if model_match([("any",) if c == "*" else ("one",) if c == "?" else ("lit", c)
                                for c in r["match"]["tool"]], tool)]
    denies = [r for r in matching if r["decision"] == "deny"]
    asks = [r for r in matching if r["decision"] == "ask"]
    allows = [r for r in matching if r["decision"] == "allow"]
    if denies:
        want = denies[0]
    elif asks:
        most = max(r["approvals"] for r in asks)
        want = next(r for r in asks if r["approvals"] == most)
    elif allows:
        want = allows[0]
    else:
        want = None
    got = policy.decide(tool=tool, apply="h", label="l", session="s", payload={})
    if want is None:
        assert (got.decision, got.rule) == (default, None)
    else:
        assert (got.decision, got.rule) == (want["decision"], want["name"])
        assert got.auto == bool(want.get("auto"))
        assert got.approvals == (want.get("approvals", 0) if want["decision"] == "ask" else 0)
    explained = policy.explain(tool=tool, apply="h", label="l", session="s", payload={})
    assert sorted(r.name for r, _why in explained.matched) == sorted(
        r["name"] for r in matching if r is not want)


@pytest.mark.parametrize(("glob", "text", "matches"), [
    ("deploy*", "deploy-prod", True), ("deploy*", "Deploy", False),  # case-sensitive
    ("*", "a/b.c", True), ("a*c", "a/x/c", True),  # no path meaning
    ("?", "", False), ("?", "/", True), ("a?c", "abc", True),
    ("[abc]x", "bx", True), ("[a-c]", "d", False), ("[!a-c]", "d", True),
    ("[]]", "]", True), ("[!]]", "]", False), ("[-a]", "-", True), ("[a-]", "-", True),
    ("\\*", "*", True), ("\\*", "x", False), ("a\\?", "a?", True),
    ("shell", "shell", True), ("shell", "shells", False), ("**", "", True),
])
def test_the_glob_syntax(glob: str, text: str, matches: bool) -> None:
    assert Glob(glob).matches(text) is matches


@pytest.mark.parametrize("glob", ["[a-", "[]", "[z-a]", "ab\\", "[a\\"])
def test_bad_globs_are_refused(glob: str) -> None:
    with pytest.raises(BadGlob):
        parse(glob)


FIELDS = ("tool", "apply", "label", "session")
conditions = st.dictionaries(st.sampled_from(FIELDS), st.sampled_from(["*", "a*", "?b", "ab", "b"]),
                             max_size=4)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["allow", "deny"]), conditions), max_size=6),
       st.fixed_dictionaries({f: st.sampled_from(["ab", "b", "a", "bb"]) for f in FIELDS}))
def test_every_key_of_a_match_must_hold(specs: list[tuple[str, dict[str, str]]],
                                        action: dict[str, str]) -> None:
    """tool, apply, label and session, each a glob, against the model: a rule matches when
    every key it gives holds (none given: it matches everything)."""
    document: dict[str, Any] = {"default": "ask", "rules": [
        {"name": f"r{i}", "match": match, "decision": d}
        for i, (d, match) in enumerate(specs)]}

    def tokens(glob: str) -> list[Token]:
        return [("any",) if c == "*" else ("one",) if c == "?" else ("lit", c) for c in glob]

    matching = [r for r in document["rules"]
                if all(model_match(tokens(g), action[f]) for f, g in r["match"].items())]
    want = next((r for r in matching if r["decision"] == "deny"), None) or next(
        iter(matching), None)
    got = Policy(document).decide(payload={}, **action)
    assert (got.decision, got.rule) == ((want["decision"], want["name"]) if want
                                        else ("ask", None))


def test_a_policy_in_yaml_reads_as_its_json() -> None:
    text = "default: deny\nrules:\n  - name: r\n    match: {tool: 'read_*'}\n" \
           "    decision: allow\n    auto: true\n"
    assert read_document(text, "p.yaml") == {"default": "deny", "rules": [
        {"name": "r", "match": {"tool": "read_*"}, "decision": "allow", "auto": True}]}
    with pytest.raises(InvalidInput, match="neither JSON nor YAML"):
        read_document("rules: [unclosed", "p.yaml")
    assert read_document('{"rules": []}', "p.json") == {"rules": []}


def test_yaml_without_pyyaml_is_one_line_saying_so() -> None:
    """PyYAML is the ``yaml`` extra: a process without it refuses a YAML policy in one line."""
    code = ("import sys; sys.modules['yaml'] = None\n"
            "from pending_actions.broker.rules import read_document\n"
            "from pending_actions.broker.errors import InvalidInput\n"
            "try:\n    read_document('default: deny', 'p.yaml')\n"
            "except InvalidInput as exc:\n    print(exc)\n")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    assert said.count("\n") == 1 and "PyYAML" in said and "pip install" in said, said
