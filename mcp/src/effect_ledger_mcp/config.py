"""The gateway's configuration file (API.md section 16) and the policy decision for one tool."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

Mode = Literal["wrap", "pass", "deny"]
ToolErrorOutcome = Literal["unknown", "not_applied"]
SEPARATOR = "__"  # exposed tool names are `server__tool`
STATUS_TOOL = "effect_ledger__status"
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 3000.0  # the lease (timeout + margin) must stay within the ledger's 3600 s
SERVER_NAME = re.compile(r"^[A-Za-z0-9.-](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9.-])?\Z")


class ConfigError(ValueError):
    """The configuration file cannot be used; the message says why."""


class LedgerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the ledger is and how the gateway authenticates to it."""

    url: str
    token_file: str | None = None
    # HTTP transport only: use the host's own `Authorization: Bearer` token as the ledger token.
    token_from_host: bool = False


class StdioUpstream(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """An upstream MCP server started as a subprocess and spoken to over its stdin/stdout."""

    command: str
    args: list[str] = []
    env: dict[str, str] = {}
    type: str | None = None  # some hosts' files say "stdio" here; the gateway goes by `command`


class HttpUpstream(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """An upstream MCP server reached over streamable HTTP."""

    url: str
    headers: dict[str, str] = {}
    type: str | None = (
        None  # some hosts' files say "http" or "streamable-http" here; the gateway goes by `url`
    )


Upstream = StdioUpstream | HttpUpstream


class ToolRule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What the policy says about the tools one glob matches."""

    mode: Mode | None = None  # absent: the policy's default
    volatile: list[str] = []
    inject: dict[str, str] = {}
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    on_tool_error: ToolErrorOutcome = "unknown"


class Policy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The default mode and the per-glob rules."""

    default: Literal["wrap", "pass"] = "wrap"
    tools: dict[str, ToolRule] = {}


class _File(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ledger: LedgerConfig
    mcpServers: dict[str, dict[str, Any]]
    run_id: str | None = None
    policy: Policy = msgspec.field(default_factory=Policy)


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The policy decision for one exposed tool."""

    mode: Mode
    volatile: frozenset[str] = frozenset()
    inject: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    on_tool_error: ToolErrorOutcome = "unknown"
    rule: str | None = None  # the glob that decided, None for the default

    @property
    def left_out(self) -> frozenset[str]:
        """Argument names outside the intent: the volatile ones and the injected ones (whose value the
        gateway overwrites, so what the model sent there cannot matter)."""
        return self.volatile | frozenset(self.inject)


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole configuration, validated."""

    ledger: LedgerConfig
    servers: dict[str, Upstream]
    run_id: str | None
    policy: Policy
    base_dir: Path

    def token_path(self) -> Path | None:
        """The ledger token file, relative paths taken from the configuration file's folder."""
        if self.ledger.token_file is None:
            return None
        path = Path(self.ledger.token_file).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def decide(self, exposed_name: str) -> Decision:
        """The policy for `server__tool`: an exact key first, else the first glob that matches, in
        file order, else the default. Tool annotations never take part."""
        rules = self.policy.tools
        chosen: tuple[str, ToolRule] | None = None
        if exposed_name in rules:
            chosen = (exposed_name, rules[exposed_name])
        else:
            for pattern, rule in rules.items():
                if fnmatch.fnmatchcase(exposed_name, pattern):
                    chosen = (pattern, rule)
                    break
        if chosen is None:
            return Decision(mode=self.policy.default)
        pattern, rule = chosen
        return Decision(
            mode=rule.mode or self.policy.default,
            volatile=frozenset(rule.volatile),
            inject=dict(rule.inject),
            timeout_seconds=rule.timeout_seconds,
            on_tool_error=rule.on_tool_error,
            rule=pattern,
        )


def _upstream(name: str, raw: dict[str, Any]) -> Upstream:
    if name == STATUS_TOOL.split(SEPARATOR)[0]:
        raise ConfigError(f"mcpServers: {name!r} is reserved for the gateway's own tools")
    if not SERVER_NAME.match(name) or SEPARATOR in name:
        raise ConfigError(
            f"mcpServers: {name!r} is not a usable server name (letters, digits, '.', '-', '_', no '__')"
        )
    kind: type[Upstream] = StdioUpstream if "command" in raw else HttpUpstream
    if ("command" in raw) == ("url" in raw):
        raise ConfigError(f"mcpServers.{name}: needs exactly one of 'command' or 'url'")
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"mcpServers.{name}: {exc}") from None


def parse_config(data: bytes, base_dir: Path) -> Config:
    """Validate a configuration document; a ConfigError names the first problem."""
    try:
        raw = msgspec.json.decode(data, type=_File)
    except msgspec.ValidationError as exc:
        raise ConfigError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"not JSON: {exc}") from None
    servers = {name: _upstream(name, value) for name, value in raw.mcpServers.items()}
    for pattern, rule in raw.policy.tools.items():
        if not 0 < rule.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise ConfigError(
                f"policy.tools.{pattern}.timeout_seconds: between 0 and {MAX_TIMEOUT_SECONDS:g}"
            )
        for argument, template in rule.inject.items():
            if "{operation_id}" not in template:
                raise ConfigError(f"policy.tools.{pattern}.inject.{argument}: must contain {{operation_id}}")
    return Config(ledger=raw.ledger, servers=servers, run_id=raw.run_id, policy=raw.policy, base_dir=base_dir)


def load_config(path: str | Path) -> Config:
    """Read and validate the configuration file."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror}") from None
    return parse_config(data, file.resolve().parent)
