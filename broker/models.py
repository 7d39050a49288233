"""Wire and storage models. Everything stored or sent is JSON made by orjson."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, ClassVar, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from pending_actions.broker.errors import InvalidInput

NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
TOOL_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")

Kind = Literal["action", "directive", "standing"]
ResolveAction = Literal["apply", "discard"]

TENANT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")
DEFAULT_TENANT = "default"


def check_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not TENANT_RE.match(tenant):
        raise InvalidInput("tenant", f"must be 1-64 characters of A-Z a-z 0-9 . _ - "
                                     f"(got {tenant!r})")
    return tenant


def check_session(session: object) -> str:
    if not isinstance(session, str) or not NAME_RE.match(session):
        raise InvalidInput(
            "session", f"must be 1-128 characters of A-Z a-z 0-9 . _ : - (got {session!r})"
        )
    return session


PERSON_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}\Z")
# the ``by`` of what a policy applies at once (``policy:<rule>``, broker/policy/rules.py AUTO_BY)
RESERVED_BY = "policy:"


def person(field: str, name: object) -> str:
    """A person's name as every comparison and record of one takes it (approvers, ``by``,
    token names): NFKC-normalized, trimmed and case-folded, so that ``Alice``, `` alice `` and
    the same name in full-width letters are one person and count once; then 1-128 of
    A-Z a-z 0-9 . _ : @ -, else InvalidInput naming ``field``. (NFKC again after folding:
    folding can undo it.)"""
    if isinstance(name, str):
        folded = unicodedata.normalize(
            "NFKC", unicodedata.normalize("NFKC", name).strip().casefold())
        if folded.startswith(RESERVED_BY):
            # what a policy applies at once is by "policy:<rule>": no person may look like one
            raise InvalidInput(field, f"{RESERVED_BY}... names what a policy applied, never a "
                                      f"person (got {name!r})")
        if PERSON_RE.match(folded):
            return folded
    raise InvalidInput(field, f"must be a name of 1-128 characters of A-Z a-z 0-9 . _ : @ - "
                              f"(got {name!r})")


def check_handler_name(field: str, name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidInput(field, f"must be 1-128 characters of A-Z a-z 0-9 . _ : - (got {name!r})")
    return name


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch: ``patch`` applied to ``target`` (neither is changed)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def patch_between(source: Any, target: Any) -> Any:
    """A JSON Merge Patch that turns ``source`` into ``target`` (``merge_patch(source, it) ==
    target``): what people's edits of an ask action compose to. A ``null`` inside ``target``
    that ``source`` lacks cannot be said by a merge patch; none of ours makes one (an edit's
    nulls delete)."""
    if not isinstance(source, dict) or not isinstance(target, dict):
        return target
    out: dict[str, Any] = {key: None for key in source if key not in target}
    for key, value in target.items():
        if key not in source:
            out[key] = value
        elif source[key] != value or type(source[key]) is not type(value):
            out[key] = patch_between(source[key], value) if isinstance(value, dict) and \
                isinstance(source[key], dict) else value
    return out


def _first_error(exc: ValidationError) -> InvalidInput:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "input"
    return InvalidInput(field, err["msg"])


class Spec(BaseModel):
    """A staged action, directive or standing handler, as stored in the actions hash. Fields
    a newer version added are ignored, so an older worker still serves its specs. A field at
    its default is not stored (``spec_json``): reading fills it back."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # Not stored (``spec_json``): the actions hash's field is the id, which names the tool, and
    # its key names the session, so ``read`` fills them in from where the spec was found
    # (~80 B less per action); specs an older version wrote still carry them
    id: str = ""
    session: str = ""
    kind: Kind = "action"
    tool: str = ""
    label: str
    # take.lua reads apply, reject and expires_at from the stored JSON text: they must stay
    # ahead of any free-form field (payload, and any field added later that may hold an object)
    apply: str
    reject: str | None = None
    expires_at: float | None = None
    # what the tenant's policy decided at stage ({rule, decision, approvals, version, auto?},
    # broker/policy/rules.py Verdict.stamp): flat, and ahead of the payload, where take.lua reads it
    policy: dict[str, Any] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    # what the preview was computed from (a file's content hash, say); the handler compares
    fingerprint: str | None = None
    # JSON Schema of the payload, checked against every edit (``resolve(edit=)``)
    payload_schema: dict[str, Any] | None = None
    tenant: str = "default"  # older specs have none: they were all the default tenant's
    # the W3C trace context the action was staged in (broker/tracing.py), None without one
    trace: str | None = None

    @classmethod
    def read(cls, raw: bytes | str, action_id: str, session: str) -> Spec:
        """The spec stored as ``raw`` under ``action_id`` in ``session``'s actions hash or slot
        (``ValidationError`` when it does not parse)."""
        spec = cls.model_validate_json(raw)
        return spec.model_copy(update={"id": action_id, "session": session,
                                       "tool": spec.tool or tool_of(action_id)})


def tool_of(action_id: str) -> str:
    """``pending-action:<tool>:<seq>`` (a slot's: ``directive:<tool>:<seq>``): a tool name has
    no colon, so the tool is the id's second part."""
    parts = action_id.split(":")
    return parts[1] if len(parts) == 3 else "?"


_UNSTORED = ("id", "session", "tool")
SPEC_FIELDS = tuple(name for name in Spec.model_fields if name not in _UNSTORED)
# the stored value of a field that has a default and is at it (a required field never is)
_DEFAULTS = {name: f.get_default(call_default_factory=True)
             for name, f in Spec.model_fields.items() if not f.is_required()}
_REQUIRED = object()


def spec_json(fields: dict[str, Any]) -> bytes:
    """A spec as stored, from fields a producer has checked (no model on this path: it is the
    stage's hot loop): in ``Spec``'s order, which take.lua relies on, and without the fields at
    their default. An action in the default tenant with no reject handler, ttl, fingerprint or
    schema stores 4 fields, not 13: the actions hash is most of a staged action's memory."""
    return orjson.dumps({name: fields[name] for name in SPEC_FIELDS
                         if name in fields and fields[name] != _DEFAULTS.get(name, _REQUIRED)})


class ActionState(BaseModel):
    """The mutable counters kept beside each spec, and people's approvals of an ask action:
    who approved so far, the composed JSON Merge Patch of their edits (JSON text: the spec
    stays as staged) and how many edits were made (``revision``)."""

    attempts: int = 0
    stalls: int = 0
    last_error: str | None = None
    approved_by: list[str] | None = None
    # approver -> the grant id of the serve token that approval came through (take.lua drops
    # the approvals of revoked ones); the verb the approvals are of (None: apply)
    grants: dict[str, str] | None = None
    approving: ResolveAction | None = None
    edit: str | None = None
    revision: int = 0

    @property
    def patch(self) -> dict[str, Any] | None:
        value = orjson.loads(self.edit) if self.edit else None
        return value if isinstance(value, dict) else None


class PendingAction(BaseModel):
    """What ``pending()`` and handlers see: the spec with its counters."""

    model_config = ConfigDict(frozen=True)

    id: str
    session: str
    kind: Kind
    tool: str
    label: str
    apply: str
    reject: str | None
    payload: dict[str, Any]
    created_at: float
    expires_at: float | None
    attempts: int
    last_error: str | None
    tenant: str = "default"
    state: Literal["pending", "in_flight"] = "pending"
    fingerprint: str | None = None
    payload_schema: dict[str, Any] | None = None
    # true when the payload is the staged one with people's or the resolver's edit merged in
    edited: bool = False
    # the policy's decision at stage (None: no policy), who approved so far, how many edits
    # people made (an approval pins the revision it saw)
    policy: dict[str, Any] | None = None
    approved_by: list[str] = Field(default_factory=list)
    # what those approvals are of: an apply, or a discard that runs the reject handler
    approving: ResolveAction = "apply"
    revision: int = 0

    @classmethod
    def build(cls, spec: Spec, st: ActionState, state: str = "pending",
              edit: dict[str, Any] | None = None) -> PendingAction:
        fields = {**spec.model_dump(), "attempts": st.attempts, "last_error": st.last_error,
                  "state": state, "approved_by": st.approved_by or [],
                  "approving": st.approving or "apply", "revision": st.revision}
        payload, edited = spec.payload, False
        for patch in (st.patch, edit):  # people's edits as approved, then this resolve's
            if patch is not None:
                payload, edited = merge_patch(payload, patch), True
        if edited:
            fields.update(payload=payload, edited=True)
        return cls.model_validate(fields)


class ResolveInput(BaseModel):
    """The model-facing input of the ``resolve`` tool."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: ResolveAction
    reason: str
    extra: dict[str, Any] | None = None

    @classmethod
    def parse(cls, action: object, reason: object, extra: object) -> ResolveInput:
        try:
            return cls.model_validate({"action": action, "reason": reason, "extra": extra})
        except ValidationError as exc:
            raise _first_error(exc) from None

    @classmethod
    def of_call(cls, arguments: object) -> ResolveInput:
        """A model's tool call's arguments, as the model sent them: exactly the tool's fields.
        Any other key (``approver``, ``by``, ``edit``, ...: what only trusted code may pass) is
        an error naming it, never passed on."""
        if not isinstance(arguments, dict):
            raise InvalidInput("input", "the resolve tool's arguments must be a JSON object")
        unknown = sorted(str(k) for k in arguments if k not in cls.model_fields)
        if unknown:
            raise InvalidInput(unknown[0], "not an argument of resolve (it takes "
                               f"{', '.join(sorted(cls.model_fields))})")
        return cls.parse(arguments.get("action"), arguments.get("reason"),
                         arguments.get("extra"))


class ResolveRequest(BaseModel):
    """One entry of the request stream: this model's JSON under the field ``FIELD``. Written
    by producers, read by resolve workers."""

    FIELD: ClassVar[bytes] = b"r"
    model_config = ConfigDict(extra="ignore")  # a newer producer's fields: still served

    req: str = Field(pattern=r"^[0-9a-f]{32}$")
    session: str
    action: ResolveAction
    reason: str
    extra: dict[str, Any] | None = None
    # how long the caller waits, measured by the caller; the request expires that long after
    # its stream entry's id, which is Redis time. deadline_ms (the caller's wall clock) is
    # only for workers older than timeout_ms
    timeout_ms: int | None = Field(default=None, gt=0)
    deadline_ms: int = 0
    expect_id: str | None = Field(default=None, max_length=300)
    by: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:@-]{1,128}$")
    # a JSON Merge Patch for the payload, checked by the producer against the target's schema
    edit: dict[str, Any] | None = None
    # a person's resolve (an ask action counts it as an approval); never the model's
    approver: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:@-]{1,128}$")
    # the target's revision the caller saw (people's edits so far); another one is refused
    revision: int | None = Field(default=None, ge=0)
    # with an approver's edit: the patch from the staged payload to the edited one (JSON text)
    patched: str | None = None
    # the serve token an approver's resolve came through (``Principal.grant``): revoked, its
    # approvals stop counting
    grant: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    # whose resolve this is (serve's token, an MCP server's tenant): another tenant's session
    # is, to it, a session with nothing in it
    tenant: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    # with an edit: the tenant and the version of its policy the edit was decided by ("" for
    # none); the take refuses it when the partition's marker says another
    decided: tuple[str, str] | None = None
    # the W3C trace context of the caller's resolve (broker/tracing.py); not written without one
    trace: str | None = Field(default=None, max_length=600)

    @field_validator("session")
    @classmethod
    def _session(cls, v: str) -> str:
        return check_session(v)

    def expires_ms(self, entry_id: bytes) -> int:
        """When this request, read from stream entry ``entry_id``, expires (Redis time)."""
        if self.timeout_ms is None:
            return self.deadline_ms
        return int(entry_id.split(b"-")[0]) + self.timeout_ms

    @model_serializer(mode="wrap")
    def _no_trace(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """No ``trace`` field at all without a context: no bytes for those who do not trace."""
        fields: dict[str, Any] = dump(self)
        if fields.get("trace") is None:
            fields.pop("trace", None)
        return fields

    @staticmethod
    def encode(req: str, session: str, action: str, reason: str, extra: dict[str, Any] | None,
               timeout_ms: int, deadline_ms: int, expect_id: str | None, by: str | None,
               edit: dict[str, Any] | None, trace: str | None = None,
               approver: str | None = None, revision: int | None = None,
               patched: str | None = None, grant: str | None = None,
               tenant: str | None = None, decided: tuple[str, str] | None = None) -> bytes:
        """``ResolveRequest(...).model_dump_json()``, made without the model from fields the
        producer has checked as the model would: the caller's side of a resolve, where the
        model's validation and dump cost an idle process ~0.15 ms. Same fields in the same
        order (``tests/test_input.py`` compares the two)."""
        fields = {"req": req, "session": session, "action": action, "reason": reason,
                  "extra": extra, "timeout_ms": timeout_ms, "deadline_ms": deadline_ms,
                  "expect_id": expect_id, "by": by, "edit": edit, "approver": approver,
                  "revision": revision, "patched": patched, "grant": grant,
                  "tenant": tenant, "decided": decided}
        if trace is not None:
            fields["trace"] = trace
        return orjson.dumps(fields)

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> ResolveRequest:
        """Raises pydantic's ValidationError for a malformed entry."""
        return cls.model_validate_json(fields.get(cls.FIELD, b""))


class Lease(BaseModel):
    """An in-flight attempt, as written by take.lua (cjson: only strings and numbers)."""

    id: str
    kind: Kind
    token: str
    attempt: int
    req: str
    action: ResolveAction
    deadline: int
    state: Literal["dispatched", "running"]
    reason: str = ""
    extra: str = "null"
    by: str = ""  # who resolved (a serve token's name), "" when not said
    # the context of the take that wrote it (broker/tracing.py): the handler span's parent
    trace: str | None = None

    @property
    def extra_value(self) -> dict[str, Any] | None:
        value = orjson.loads(self.extra)
        return value if isinstance(value, dict) else None


class Result(BaseModel):
    """The one result shape of resolve, errors included."""

    content: list[dict[str, Any]]
    details: dict[str, Any]
    is_error: bool

    @property
    def text(self) -> str:
        return "\n".join(str(c.get("text", "")) for c in self.content if c.get("type") == "text")

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump())
