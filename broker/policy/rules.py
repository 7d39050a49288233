"""Policies: a tenant's rules, checked once when they are set, compiled once per version, and
evaluated by the client that stages (``producers/policy_versions.py``), never rule by rule in Redis.

The document (docs/policies.md): ``{"default": "allow"|"ask"|"deny", "rules": [rule, ...]}``,
a rule ``{"name", "match", "decision", "reason"?, "approvals"?, "auto"?}``. Precedence: any
matching ``deny`` wins (the first in the document), else the matching ``ask`` with the largest
``approvals`` (the first of those), else the first matching ``allow``, else ``default``.

Globs and payload paths are ``broker/policy/globs.py``'s; an absent path does not match."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

import orjson

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.models import RESERVED_BY
from pending_actions.broker.policy.globs import (
    MISSING,
    BadGlob,
    Glob,
    index_of,
    lookup,
    parse,
    parse_path,
    same,
)

Decision = Literal["allow", "ask", "deny"]
DECISIONS: tuple[Decision, ...] = ("allow", "ask", "deny")
RULE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")
MAX_RULES = 1_000
MAX_APPROVALS = 16
MAX_REASON_CHARS = 1_000
GLOB_FIELDS = ("tool", "apply", "label", "session")
MATCH_KEYS = (*GLOB_FIELDS, "payload")
RULE_KEYS = ("name", "match", "decision", "reason", "approvals", "auto")
DOCUMENT_KEYS = ("default", "rules")
AUTO_BY = RESERVED_BY  # the ``by`` of what a policy applies at once: ``policy:<rule>``


@dataclass(frozen=True)
class Rule:
    index: int
    name: str
    decision: Decision
    approvals: int
    auto: bool
    reason: str | None
    globs: tuple[tuple[int, Glob], ...]  # (field's index in GLOB_FIELDS, its glob), no tool
    payload: tuple[tuple[tuple[str, ...], Glob], ...]  # (path, a glob for a string)
    # (path, an exact value): checked first, the cheapest to refuse
    exact: tuple[tuple[tuple[str, ...], Any], ...] = ()
    tool: Glob | None = None

    def matches(self, values: tuple[str, str, str, str], payload: dict[str, Any],
                tool_checked: bool = False) -> bool:
        """``values``: tool, apply, label, session; ``tool_checked``: the tool is known to
        match (the rule is one of the tool's candidates)."""
        if not tool_checked and self.tool is not None and not self.tool.matches(values[0]):
            return False
        for parts, want in self.exact:
            got = lookup(payload, parts)
            if got is MISSING or not same(got, want):
                return False
        for i, glob in self.globs:
            if not glob.matches(values[i]):
                return False
        for parts, want in self.payload:
            got = lookup(payload, parts)
            if got is MISSING:
                return False
            if not isinstance(got, str) or not want.matches(got):
                return False
        return True


@dataclass(frozen=True)
class Verdict:
    """The decision for one action: by ``rule`` (None: the document's default) of ``version``;
    ``approvals`` for ask, ``auto`` for allow, the rule's ``reason``."""

    decision: Decision
    rule: str | None
    approvals: int = 0
    auto: bool = False
    reason: str | None = None
    version: int = 0

    def stamp(self) -> dict[str, Any]:
        """What the action's spec keeps (``policy``): flat, no nested object (take.lua reads it
        from the spec's text). One dict per verdict, shared: never changed."""
        return _stamp(self)

    def _stamp(self) -> dict[str, Any]:
        # approvals always (0 but for ask): the shape CONTRACT section 8 shows
        out: dict[str, Any] = {"rule": self.rule, "decision": self.decision,
                               "approvals": self.approvals, "version": self.version}
        if self.auto:
            out["auto"] = True
        return out

    @property
    def code(self) -> str:
        """What stage.lua is told: allow, ask, deny, or auto (allow + auto)."""
        return "auto" if self.auto else self.decision

    @property
    def weight(self) -> tuple[int, int]:
        """How strict the decision is: ``strictness`` of it."""
        return strictness(self.decision, self.approvals)


def strictness(decision: str | None, approvals: int | None = 0) -> tuple[int, int]:
    """Deny > ask with more approvals > ask > allow (auto or not, and no policy at all: None).
    What a stamp (``Verdict.stamp``) or a verdict says, comparable: the stricter is larger."""
    if decision == "deny":
        return (2, 0)
    if decision == "ask":
        return (1, int(approvals or 1))
    return (0, 0)


_stamp = functools.cache(Verdict._stamp)


@dataclass(frozen=True)
class Explained:
    verdict: Verdict
    matched: list[tuple[Rule, str]]  # every matching rule but the deciding one, and why it lost


class Policy:
    """One version of a tenant's policy, compiled."""

    def __init__(self, document: dict[str, Any], version: int = 0) -> None:
        self.document = check_document(document)
        self.version = version
        self.default: Decision = self.document.get("default", "allow")
        self.rules = [_compile(i, r) for i, r in enumerate(self.document["rules"])]
        self._verdicts = [self._verdict(r) for r in self.rules]  # made once, shared
        self._fallback = self._verdict(None)
        self._decide = _compiled(self)

    def decide(self, *, tool: str, apply: str, label: str, session: str,
               payload: dict[str, Any], reject: str | None = None) -> Verdict:
        """The one decision for an action (docs/policies.md, the approval boundary): every
        handler it names is decided, ``apply`` and then ``reject`` as ``match.apply`` with
        everything else the same, and the stricter verdict is the action's (on a tie, the
        apply handler's: its ``auto`` stands only if the reject handler asks no more). Every
        path that can run a handler is decided here: a stage, a slot, an edit, a proxied
        call."""
        verdict = self._decide(tool, apply, label, session, payload)
        if reject is None or reject == apply:
            return verdict
        other = self._decide(tool, reject, label, session, payload)
        return other if other.weight > verdict.weight else verdict

    def _verdict(self, rule: Rule | None) -> Verdict:
        if rule is None:
            return Verdict(self.default, None, 1 if self.default == "ask" else 0,
                           version=self.version)
        return Verdict(rule.decision, rule.name, rule.approvals, rule.auto, rule.reason,
                       self.version)

    def explain(self, *, tool: str, apply: str, label: str, session: str,
                payload: dict[str, Any], reject: str | None = None) -> Explained:
        """The decision, and every other rule that matched (for either handler) with why it
        lost."""
        verdict = self.decide(tool=tool, apply=apply, label=label, session=session,
                              payload=payload, reject=reject)
        handlers = [apply] if reject is None else [apply, reject]
        won = next((r for r in self.rules if r.name == verdict.rule), None)
        matched = [r for r in self.rules if r is not won and any(
            r.matches((tool, h, label, session), payload) for h in handlers)]
        return Explained(verdict, [(r, _why(r, won, verdict)) for r in matched])


def _compiled(policy: Policy) -> Callable[..., Verdict]:
    """The policy as one Python function of (tool, apply, label, session, payload): each rule
    one ``if`` in precedence order (denies, then asks by approvals, then allows, each group in
    document order), its conditions inline, cheapest first; the same decisions as the rules'
    own ``matches`` (``explain`` uses those), at a fraction of the cost: a stage evaluates
    every rule of its tenant's policy that could apply. The text holds no value of the
    document but dict keys, written with ``repr`` (always a string literal); the values are in
    the lists it closes over."""
    consts: list[Any] = []

    def const(value: Any) -> str:
        consts.append(value)
        return f"C[{len(consts) - 1}]"

    def glob_test(glob: Glob, subject: str) -> str:
        if glob.literal:
            return f"{subject} == {const(glob.text)}"
        if glob.everything:
            return "True"
        return f"{const(glob.matches)}({subject})"

    def walk(parts: tuple[str, ...]) -> list[str]:
        steps = [f"(w := payload.get({parts[0]!r}, M)) is not M"]
        for part in parts[1:]:
            k = index_of(part)
            if k is None:
                steps.append(f"type(w) is dict and (w := w.get({part!r}, M)) is not M")
            else:
                steps.append(f"(w := (w[{k}] if type(w) is list and len(w) > {k} else "
                             f"w.get({part!r}, M) if type(w) is dict else M)) is not M")
        return steps

    def exact_test(want: Any) -> str:
        if want is None or isinstance(want, bool):
            return f"w is {want!r}"
        if isinstance(want, int | float):
            return f"(type(w) is int or type(w) is float) and w == {const(want)}"
        return f"same(w, {const(want)})"

    fields = ("tool", "apply", "label", "session")
    order = ([r for r in policy.rules if r.decision == "deny"]
             + sorted((r for r in policy.rules if r.decision == "ask"),
                      key=lambda r: (-r.approvals, r.index))
             + [r for r in policy.rules if r.decision == "allow"])
    lines = ["def decide(tool, apply, label, session, payload):"]
    for rule in order:
        tests = [glob_test(rule.tool, "tool")] if rule.tool is not None else []
        for parts, want in rule.exact:
            tests += [*walk(parts), exact_test(want)]
        tests += [glob_test(g, fields[i]) for i, g in rule.globs]
        for parts, glob in rule.payload:
            tests += [*walk(parts), "type(w) is str", glob_test(glob, "w")]
        condition = " and ".join(f"({x})" for x in tests if x != "True") or "True"
        lines += [f"    if {condition}:", f"        return V[{rule.index}]"]
    lines.append("    return F")
    scope: dict[str, Any] = {"C": consts, "V": policy._verdicts, "F": policy._fallback,
                             "M": MISSING, "same": same}
    exec(compile("\n".join(lines), f"<policy v{policy.version}>", "exec"), scope)
    return cast(Callable[..., Verdict], scope["decide"])


def _why(rule: Rule, won: Rule | None, verdict: Verdict) -> str:
    if won is None:  # matched for one handler; the other fell to a stricter default
        return f"the default ({verdict.decision}) for the other handler is stricter"
    if won.decision == "deny":
        if rule.decision == "deny":
            return f"an earlier deny ({won.name}) decided"
        return f"any deny wins: {won.name} denies"
    if won.decision == "ask":
        if rule.decision == "allow":
            return f"an ask wins over allow: {won.name} asks"
        if rule.approvals < won.approvals:
            return (f"asks for {rule.approvals} approval(s); {won.name} asks for "
                    f"{won.approvals}, the most")
        return f"an earlier ask with as many approvals ({won.name}) decided"
    return f"an earlier allow ({won.name}) decided"


def _compile(index: int, rule: dict[str, Any]) -> Rule:
    match = rule["match"]
    globs = tuple((i, Glob(match[f])) for i, f in enumerate(GLOB_FIELDS) if f in match
                  and f != "tool")
    wanted = match.get("payload", {}).items()
    payload = tuple((parse_path(path), Glob(want)) for path, want in wanted
                    if isinstance(want, str))
    exact = tuple((parse_path(path), want) for path, want in wanted if not isinstance(want, str))
    decision = rule["decision"]
    approvals = rule.get("approvals", 1) if decision == "ask" else 0
    return Rule(index, rule["name"], decision, approvals, bool(rule.get("auto", False)),
                rule.get("reason"), globs, payload, exact,
                Glob(match["tool"]) if "tool" in match else None)


# --- validation: once, when a policy is set ------------------------------------------------
def check_document(document: object) -> dict[str, Any]:
    """The document, checked: InvalidInput naming the rule and the field of the first fault."""
    if not isinstance(document, dict):
        raise InvalidInput("policy", "must be a JSON object {\"default\", \"rules\"}")
    for key in document:
        if key not in DOCUMENT_KEYS:
            raise InvalidInput(str(key), f"unknown key; a policy has {', '.join(DOCUMENT_KEYS)}")
    if "default" in document and document["default"] not in DECISIONS:
        raise InvalidInput("default", f"must be allow, ask or deny (got {document['default']!r})")
    rules = document.get("rules")
    if not isinstance(rules, list):
        raise InvalidInput("rules", "must be a list of rules")
    if len(rules) > MAX_RULES:
        raise InvalidInput("rules", f"{len(rules)} rules; at most {MAX_RULES}")
    names: set[str] = set()
    for i, rule in enumerate(rules):
        _check_rule(i, rule, names)
    return document


def _check_rule(i: int, rule: object, names: set[str]) -> None:
    where = f"rules[{i}]"
    if not isinstance(rule, dict):
        raise InvalidInput(where, "must be an object {\"name\", \"match\", \"decision\"}")
    name = rule.get("name")
    if not isinstance(name, str) or not RULE_NAME_RE.match(name):
        raise InvalidInput(f"{where}.name", f"must be 1-64 of A-Z a-z 0-9 . _ - (got {name!r})")
    if name in names:
        raise InvalidInput(f"{where}.name", f"rule {name!r}: a second rule of that name")
    names.add(name)

    def bad(field: str, message: str) -> InvalidInput:
        return InvalidInput(f"{where}.{field}", f"rule {name!r}: {message}")

    for key in rule:
        if key not in RULE_KEYS:
            raise bad(str(key), f"unknown key; a rule has {', '.join(RULE_KEYS)}")
    decision = rule.get("decision")
    if decision not in DECISIONS:
        raise bad("decision", f"must be allow, ask or deny (got {decision!r})")
    if "approvals" in rule:
        approvals = rule["approvals"]
        if decision != "ask":
            raise bad("approvals", f"only an ask rule takes approvals (this one is {decision})")
        if isinstance(approvals, bool) or not isinstance(approvals, int) \
                or not 1 <= approvals <= MAX_APPROVALS:
            raise bad("approvals", f"must be a whole number 1-{MAX_APPROVALS}")
    if "auto" in rule:
        if decision != "allow":
            raise bad("auto", f"only an allow rule is applied automatically (this one is "
                              f"{decision})")
        if not isinstance(rule["auto"], bool):
            raise bad("auto", "must be true or false")
    reason = rule.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise bad("reason", f"must be a string of at most {MAX_REASON_CHARS} characters")
    match = rule.get("match")
    if not isinstance(match, dict):
        raise bad("match", "must be an object of tool, apply, label, session, payload")
    for key, value in match.items():
        if key not in MATCH_KEYS:
            raise bad(f"match.{key}", f"unknown key; match has {', '.join(MATCH_KEYS)}")
        if key == "payload":
            _check_payload(value, bad)
        else:
            _check_glob(value, f"match.{key}", bad)


def _check_glob(value: object, field: str, bad: Callable[[str, str], InvalidInput]) -> None:
    if not isinstance(value, str):
        raise bad(field, "must be a glob (a string)")
    try:
        parse(value)
    except BadGlob as exc:
        raise bad(field, f"bad glob {value!r}: {exc}") from None


def _check_payload(value: object, bad: Callable[[str, str], InvalidInput]) -> None:
    if not isinstance(value, dict):
        raise bad("match.payload", "must be an object: dotted path -> glob or exact value")
    for path, want in value.items():
        field = f"match.payload.{path}"
        try:
            parse_path(path)
        except ValueError as exc:
            raise bad(field, str(exc)) from None
        if isinstance(want, str):
            _check_glob(want, field, bad)


# --- documents as files ----------------------------------------------------------------------
def read_document(text: str | bytes, name: str = "", max_bytes: int | None = None) -> Any:
    """A policy's text: JSON, or YAML (a ``.yaml``/``.yml`` file, or text that is not JSON)
    when PyYAML is installed; one clear InvalidInput otherwise. ``max_bytes``: the longest
    text read at all (the settings' ``max_payload_bytes``), checked before any parsing. YAML
    aliases are refused before anything is built from the text: one line of them can stand
    for a document of any size (each level of ``&a [*b, *b, ...]`` multiplies it)."""
    size = len(text.encode() if isinstance(text, str) else text)
    if max_bytes is not None and size > max_bytes:
        raise InvalidInput("policy", f"{size} bytes; the limit is {max_bytes} "
                                     "(MAX_PAYLOAD_BYTES)")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        looks_yaml = name.endswith((".yaml", ".yml")) or not name
        if not looks_yaml:
            raise InvalidInput("policy", f"not JSON: {exc}") from None
        json_error = exc
    try:
        import yaml
    except ImportError:
        raise InvalidInput("policy", "not JSON, and reading YAML needs PyYAML (pip install "
                                     f"pyyaml): {json_error}") from None
    try:
        # the events alone build nothing: an alias is refused at no cost
        if any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, yaml.SafeLoader)):
            raise InvalidInput("policy", "YAML aliases (*name) are not read in a policy: "
                                         "write each value out")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput("policy", f"neither JSON nor YAML: {str(exc).splitlines()[0]}") \
            from None
