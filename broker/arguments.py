"""What each script in ``scripts/`` is called with: its KEYS and its ARGV, one NamedTuple each,
whose field order is the slot order and whose field names are the locals the script names
those slots with at its top (``tests/test_scripts.py`` reads the scripts and checks both).
``broker/scripts.py`` builds every call from these by keyword, so no caller can get an order
wrong. A NamedTuple, not a dataclass: it is what Redis is sent (no copy into a list), and it is
built in a third of the time a frozen dataclass takes. The steps of every resolve (take, begin,
finalize, readd) build theirs as ``X.__new__(X, ...)``: ``X(...)`` by keyword first packs the
keywords into a dict (type.__call__), which takes twice as long again.

A script whose KEYS or ARGV go on past its fixed slots (one key per pool, three values per
action, ...) names where that tail starts, as ``keys_tail``/``args_tail`` say: a local set to
the first slot after the fixed ones."""

from __future__ import annotations

from typing import NamedTuple


class NoArgs(NamedTuple):
    """No fixed slots."""


class StageKeys(NamedTuple):
    stack: str
    actions: str
    hist: str
    sessions: str
    tenants: str
    expiries: str
    expiries_due: str
    feed: str
    policies: str
    inflight: str
    leases: str
    requests: str


class StageArgs(NamedTuple):
    maxlen: int
    tenant: str
    session: str
    indexed: str
    feed_maxlen: int
    at: str
    policy_version: str
    dispatch_ms: int
    marker_ttl_s: int
    denial_ttl_s: int
    max_pending: int


class SetPolicyKeys(NamedTuple):
    doc: str
    current: str


class SetPolicyArgs(NamedTuple):
    tenant: str
    rest: bytes


class MarkPolicyKeys(NamedTuple):
    markers: str


class MarkPolicyArgs(NamedTuple):
    tenant: str
    version: int


class ReserveKeys(NamedTuple):
    counter: str
    mark: str
    sessions: str
    feed: str


class ReserveArgs(NamedTuple):
    size: int
    floor: int


class SlotKeys(NamedTuple):
    """set_slot's and clear_slot's: ``slot`` is the directive's key or the standing one's."""

    slot: str
    actions: str
    state: str
    hist: str


class SetSlotArgs(NamedTuple):
    action_id: str
    spec: bytes
    event: str
    maxlen: int


class ClearSlotArgs(NamedTuple):
    event: str
    maxlen: int


class PendingKeys(NamedTuple):
    stack: str
    inflight: str
    actions: str
    state: str
    expiries: str
    revoked: str


class PendingArgs(NamedTuple):
    limit: int
    session: str


class PeekKeys(NamedTuple):
    directive: str
    stack: str
    actions: str
    expiries: str


class PeekArgs(NamedTuple):
    session: str


class TakeKeys(NamedTuple):
    directive: str
    stack: str
    standing: str
    actions: str
    state: str
    inflight: str
    hist: str
    marker: str
    replies: str
    leases: str
    expiries: str
    expired: str
    requests: str
    dead: str
    revoked: str
    sessions: str
    policies: str


class TakeArgs(NamedTuple):
    req: str
    action: str
    token: str
    dispatch_ms: int
    marker_ttl_s: int
    maxlen: int
    reason: str
    extra: bytes
    none_reply: bytes
    reply_ttl_s: int
    session: str
    routes_json: bytes
    pool_count: int
    message: bytes
    expect_id: str
    by: str
    conflict_reply: bytes
    expired_reply: bytes
    memory_ms: int
    entry: bytes | str
    group: str
    claimant: str
    lease_ms: int
    own_pool: int
    trace: str
    approver: str
    revision: str
    patched: str
    grant: str
    tenant: str
    edit_tenant: str
    edit_version: str


class ApproveKeys(NamedTuple):
    directive: str
    stack: str
    actions: str
    state: str
    hist: str
    marker: str
    revoked: str
    expiries: str
    policies: str
    requests: str


class ApproveArgs(NamedTuple):
    action_id: str
    req: str
    action: str
    approver: str
    grant: str
    patched: str
    seen: bytes
    top: str
    skipped: int
    seen_directive: str
    needed: int
    session: str
    edit_tenant: str
    edit_version: str
    maxlen: int
    marker_ttl_s: int
    entry: bytes | str
    group: str


class ExpireKeys(NamedTuple):
    stack: str
    actions: str
    state: str
    expiries: str
    expired: str
    hist: str


class ExpireArgs(NamedTuple):
    action_id: str
    maxlen: int
    memory_ms: int
    session: str


class MarkExpiriesKeys(NamedTuple):
    expiries: str
    expiries_due: str


class MarkExpiriesArgs(NamedTuple):
    look_again_ms: int


class RecoverKeys(NamedTuple):
    inflight: str
    stack: str
    directive: str
    actions: str
    state: str
    hist: str
    dead: str
    replies: str
    leases: str


class RecoverArgs(NamedTuple):
    token: str
    max_stalls: int
    reply_ttl_s: int
    maxlen: int
    returned_reply: bytes
    dead_reply: bytes
    unstarted_reply: bytes
    returned_error: str
    unstarted_error: str
    member: str


class BeginKeys(NamedTuple):
    inflight: str
    actions: str
    state: str
    leases: str


class BeginArgs(NamedTuple):
    token: str
    lease_ms: int
    member: str
    claimant: str


class LeaseKeys(NamedTuple):
    """renew's, unclaim's and sweep's."""

    inflight: str
    leases: str


class UnclaimArgs(NamedTuple):
    token: str
    claimant: str
    dispatch_ms: int
    member: str


class RenewArgs(NamedTuple):
    token: str
    lease_ms: int
    member: str


class FinalizeKeys(NamedTuple):
    inflight: str
    actions: str
    state: str
    hist: str
    replies: str
    leases: str


class FinalizeArgs(NamedTuple):
    token: str
    reply: bytes
    reply_ttl_s: int
    maxlen: int
    event: str
    action_id: str
    attempt: int
    member: str


class ReaddKeys(NamedTuple):
    inflight: str
    stack: str
    directive: str
    actions: str
    state: str
    hist: str
    replies: str
    leases: str
    dead: str


class ReaddArgs(NamedTuple):
    token: str
    last_error: str
    reply: bytes
    reply_ttl_s: int
    maxlen: int
    action_id: str
    attempt: int
    member: str


class ParkKeys(NamedTuple):
    actions: str
    state: str
    inflight: str
    stack: str
    directive: str
    standing: str
    dead: str
    hist: str
    replies: str
    leases: str


class ParkArgs(NamedTuple):
    what: str
    field: str
    raw: bytes
    raw_text: str
    reason: str
    maxlen: int
    reply: bytes
    reply_ttl_s: int
    token: str
    session: str


class SessionsKeys(NamedTuple):
    """retire's and upgrade's: the partition's sessions hash."""

    sessions: str


class RetireArgs(NamedTuple):
    retention_ms: int


class UpgradeStackKeys(NamedTuple):
    stack: str


class BeatKeys(NamedTuple):
    procs: str
    beats: str


class BeatArgs(NamedTuple):
    proc: str
    loop: str
    every_ms: int
    ttl_ms: int
    info: bytes


class RegisterKeys(NamedTuple):
    pools: str
    live: str


class RegisterArgs(NamedTuple):
    pool: str
    names: bytes
    member: str
    ttl_ms: int


class SweepArgs(NamedTuple):
    session: str


class ClaimRunKeys(NamedTuple):
    run: str
    sessions: str


class ClaimRunArgs(NamedTuple):
    session: str
    tenant: str
    token: str
    lease_ms: int
    fresh: str
    ttl_ms: int


class RunKeys(NamedTuple):
    run: str


class SaveRunArgs(NamedTuple):
    token: str
    done: str
    framework: str
    state: str
    calls: bytes
    ttl_ms: int


class RenewRunArgs(NamedTuple):
    token: str
    lease_ms: int


class NoteOutcomeArgs(NamedTuple):
    action_id: str
    text: str


class Signature(NamedTuple):
    keys: type[NamedTuple]
    args: type[NamedTuple]
    keys_tail: str = ""
    args_tail: str = ""


SIGNATURES: dict[str, Signature] = {
    "stage": Signature(StageKeys, StageArgs, keys_tail="markers_at", args_tail="actions_at"),
    "set_policy": Signature(SetPolicyKeys, SetPolicyArgs),
    "mark_policy": Signature(MarkPolicyKeys, MarkPolicyArgs),
    "reserve": Signature(ReserveKeys, ReserveArgs),
    "set_slot": Signature(SlotKeys, SetSlotArgs),
    "clear_slot": Signature(SlotKeys, ClearSlotArgs),
    "pending": Signature(PendingKeys, PendingArgs),
    "peek": Signature(PeekKeys, PeekArgs),
    "take": Signature(TakeKeys, TakeArgs, keys_tail="streams_at"),
    "approve": Signature(ApproveKeys, ApproveArgs),
    "expire": Signature(ExpireKeys, ExpireArgs),
    "mark_expiries": Signature(MarkExpiriesKeys, MarkExpiriesArgs, args_tail="waiting_at"),
    "recover": Signature(RecoverKeys, RecoverArgs),
    "begin": Signature(BeginKeys, BeginArgs),
    "unclaim": Signature(LeaseKeys, UnclaimArgs),
    "renew": Signature(LeaseKeys, RenewArgs),
    "finalize": Signature(FinalizeKeys, FinalizeArgs, args_tail="noted_at"),
    "readd": Signature(ReaddKeys, ReaddArgs),
    "park": Signature(ParkKeys, ParkArgs),
    "retire": Signature(SessionsKeys, RetireArgs, keys_tail="session_keys_at",
                        args_tail="sessions_at"),
    "upgrade": Signature(SessionsKeys, NoArgs, keys_tail="tenant_keys_at",
                         args_tail="sessions_at"),
    "upgrade_stack": Signature(UpgradeStackKeys, NoArgs),
    "beat": Signature(BeatKeys, BeatArgs),
    "register": Signature(RegisterKeys, RegisterArgs),
    "sweep": Signature(LeaseKeys, SweepArgs),
    "claim_run": Signature(ClaimRunKeys, ClaimRunArgs),
    "save_run": Signature(RunKeys, SaveRunArgs),
    "note_outcome": Signature(RunKeys, NoteOutcomeArgs),
    "renew_run": Signature(RunKeys, RenewRunArgs),
}
