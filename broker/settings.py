"""The one settings class. Every knob is an env var with the prefix ``PENDING_ACTIONS_``."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PENDING_ACTIONS_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis holding all state. `up` starts an embedded redis-server (and uses "
                    "another only when given --redis-url).",
    )
    dramatiq_url: str | None = Field(
        default=None,
        description="Redis for handler tasks (default: redis_url); Redis is the only broker.",
    )
    key_prefix: str = Field(default="pa", pattern=r"^[A-Za-z0-9_.-]{1,32}$",
                            description="prefix of every key; never ending in -auth or -policy")
    queue: str = Field(default="pending-actions", description="dramatiq queue of handler runs")
    partitions: int = Field(
        default=16, ge=1, le=1024,
        description="partitions of sessions (one cluster slot each); change only when drained")
    replica_wait: int = Field(
        default=0, ge=0,
        description="replicas that must have a stage or an outcome before it is acknowledged")
    replica_wait_timeout_ms: int = Field(default=1_000, ge=1,
                                         description="how long a replica wait may take")
    pool_ttl_ms: int = Field(
        default=10_000, ge=500,
        description="a dramatiq worker's handlers count as live this long after its heartbeat")

    lease_ms: int = Field(default=15_000, ge=200, description="lease on a running attempt")
    dispatch_timeout_ms: int = Field(
        default=60_000, ge=200,
        description="how long a taken action may wait for a worker to start it")
    max_stalls: int = Field(default=3, ge=1, description="lost leases before dead-lettering")
    recovery_interval_ms: int = Field(default=1_000, ge=50)
    resolve_timeout_s: float = Field(default=60.0, gt=0)
    reply_ttl_s: int = Field(default=600, ge=1, description="how long a reply waits for its caller")
    claim_idle_ms: int = Field(default=30_000, ge=100, description="unacked request age to reclaim")
    handler_time_limit_ms: int = Field(default=600_000, ge=1_000)

    max_payload_bytes: int = Field(default=1_048_576, ge=1)
    max_label_chars: int = Field(default=1_000, ge=1)
    # a model's loop of stages (an MCP client writing in a loop) must not grow a session, and
    # what is shown of it, without end
    max_pending_per_session: int = Field(default=1_000, ge=1,
                                         description="most pending actions a session holds")
    history_maxlen: int = Field(default=1_000, ge=10)
    max_reason_chars: int = Field(default=10_000, ge=1, description="longest resolve reason")
    max_extra_bytes: int = Field(default=65_536, ge=2,
                                 description="largest resolve extra, as JSON")
    retention_s: int = Field(
        default=7 * 86_400, ge=1,
        description="how long a finished session's history and tenant claim are kept")
    run_ttl_s: int = Field(
        default=7 * 86_400, ge=1,
        description="how long a paused agent-framework run is kept for a resume after its last "
                    "change (pending_actions.adapters)")
    run_lease_s: float = Field(
        default=300.0, gt=0,
        description="how long one process holds an agent-framework run it continues before "
                    "another may take it over (a process that died mid-resume)")
    housekeeping_s: float = Field(default=10.0, gt=0,
                                  description="how often a page of sessions is retired")
    sweep_s: float = Field(
        default=600.0, gt=0,
        description="how long one pass of the slow sweep of in-flight state takes: a lease "
                    "whose index entry was lost is recovered within about this (and its lease)")
    expired_memory_s: int = Field(
        default=86_400, ge=1,
        description="how long a resolve(expect_id=) of an expired action is told it expired")

    restart_backoff_max_s: float = Field(
        default=5.0, ge=0.01, description="longest pause before restarting crashed workers")
    resolve_threads: int = Field(default=1, ge=1, le=64,
                                 description="request-serving threads per resolve worker")
    policy_check_s: float = Field(
        default=30.0, gt=0,
        description="how often a resolve worker checks Redis's eviction policy again")
    supervisor: str | None = Field(
        default=None,
        description="set by `worker` and `up` for the dramatiq processes they start: their "
                    "name, whose restart of one that died `health` counts as its successor")
    worker_id_file: str | None = Field(
        default=None,
        description="`worker` writes its name to this file once it runs, and removes it when "
                    "it stops cleanly: `health --worker @FILE` checks that worker alone")
    worker_processes: int = Field(default=1, ge=1)
    worker_threads: int = Field(default=8, ge=1)
    block_ms: int = Field(default=5_000, ge=10, le=10_000,
                          description="idle XREADGROUP block time (below the socket timeout)")

    serve_header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="longest wait of `serve` for a request's headers, whole: from the "
                    "connection's opening, and on a kept-alive one from the next request's "
                    "first byte; past it the connection is closed")
    serve_body_timeout_s: float = Field(
        default=30.0, gt=0,
        description="longest wait of `serve` for a request's body, whole, from the end of its "
                    "headers; past it a 408 (or the connection closed once an answer is out)")
    serve_keep_alive_s: float = Field(
        default=5.0, gt=0,
        description="how long `serve` keeps an idle connection open between two requests")

    webhook_urls: str | None = Field(
        default=None, description="comma-separated URLs POSTed every stage and outcome")
    webhook_secret: str | None = Field(
        default=None, description="shared secret of the webhooks' HMAC-SHA256 signature")
    webhook_retries: int = Field(default=8, ge=0, description="retries of a failed delivery")
    webhook_min_backoff_ms: int = Field(default=1_000, ge=10,
                                        description="first retry delay; doubles each retry")
    webhook_timeout_s: float = Field(default=5.0, gt=0, description="one delivery's timeout")

    inbox_url: str = Field(
        default="http://127.0.0.1:8080/",
        description="where serve's inbox page is: `token create` prints a sign-in link to it "
                    "for an approver's or an admin's token")
    mcp_upstreams: dict[str, str] = Field(
        default={},
        description="the MCP servers an operator allows behind `mcp-proxy` and in workers: a "
                    "JSON object, name -> 'COMMAND ARGS' (`--mcp-upstream NAME=...` adds to it)")
    mcp_upstream_tenants: dict[str, list[str]] = Field(
        default={},
        description="the tenants an MCP upstream is kept to: a JSON object, name -> [tenant, "
                    "...]; an upstream not named serves every tenant "
                    "(`--mcp-upstream-tenants NAME=T1,T2` adds to it)")
    mcp_call_timeout_s: float = Field(
        default=60.0, gt=0, description="longest wait for one tool call of an upstream MCP server")
    mcp_start_timeout_s: float = Field(
        default=30.0, gt=0,
        description="longest wait for an upstream MCP server to start and answer `initialize`")
    mcp_max_result_bytes: int = Field(
        default=2_097_152, ge=1_024,
        description="the longest message read from an upstream MCP server (one JSON-RPC line): "
                    "an answer past it is dropped unread and its call fails at once")
    """Twice the default ``max_payload_bytes``: an SDK server sends a text result twice (its
    content and its structuredContent), so this reads a text of about the payload limit, some
    250k tokens, more than a model's context holds. A worker stores what it reads as the
    resolve's result in Redis; a cap there keeps one answer from filling it (a 20 MB one took
    36 s to reach the model, and a 50 MB one stalled the proxy for a minute)."""

    @field_validator("key_prefix")
    @classmethod
    def _not_an_auth_prefix(cls, value: str) -> str:
        # a deployment's auth keys are "<prefix>-auth:...", outside the "<prefix>:*" pattern
        # of its producer and worker users: a prefix "x-auth" would give its users the auth
        # keys of a deployment "x" on the same Redis
        if value.endswith("-auth"):
            raise ValueError("must not end in -auth (the auth keys' prefix is KEY_PREFIX-auth)")
        # the same for the policies, which producer and worker users may only read
        if value.endswith("-policy"):
            raise ValueError("must not end in -policy (the policies' prefix is "
                             "KEY_PREFIX-policy)")
        return value

    @field_validator("inbox_url")
    @classmethod
    def _a_page_address(cls, value: str) -> str:
        return page_address(value)

    def require_url(self) -> str:
        from pending_actions.broker.errors import ConfigError

        if not self.redis_url:
            raise ConfigError(
                "no Redis URL: pass --redis-url or set PENDING_ACTIONS_REDIS_URL"
            )
        return self.redis_url


def page_address(value: str) -> str:
    """An http(s) address of the inbox page, to put a token after as a fragment: one with a
    fragment of its own would hide the token's (ValueError)."""
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or "#" in value:
        raise ValueError(f"must be the http(s) address of the inbox page, without a #fragment "
                         f"(got {value!r})")
    return value
