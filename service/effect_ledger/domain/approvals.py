"""Approvals (API.md section 15), the parts that need no row: the policy, the request's effective
status by a clock, the view, and the hash of an approval event. The decisions that need the row
(gate, consumption, decide, revoke) are taken where it is locked (migration 0011)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.chain import GENESIS_HASH  # approval chains start where operation chains do
from effect_ledger.domain.timefmt import format_ts

STATUSES = ("pending", "approved", "denied", "revoked", "expired", "consumed")
LIVE = frozenset({"pending", "approved", "denied"})
EVENT_KINDS = ("requested", "approved", "denied", "revoked", "expired", "consumed")
EVENT_HASHED_FIELDS = ("approval_id", "seq", "at", "kind", "actor", "data")
MAX_NOTE = 2000
MAX_REASON = 500
_RULE_FIELDS = frozenset({"tool", "required", "ttl_seconds"})


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """One rule: tools matching `tool` (a glob) need `required` distinct yeses, valid `ttl_seconds`."""

    tool: str
    required: int = 1
    ttl_seconds: int = 900

    def covers(self, tool: str) -> bool:
        """Whether this rule applies to `tool` (fnmatch glob, case-sensitive)."""
        return fnmatchcase(tool, self.tool)


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """`APPROVAL_POLICY`: a default list of rules and per-tenant lists; the first match applies."""

    default: tuple[ApprovalRule, ...] = ()
    tenants: Mapping[str, tuple[ApprovalRule, ...]] = field(default_factory=dict)

    def rule_for(self, tenant: str, tool: str) -> ApprovalRule | None:
        """The first rule of the tenant's list that covers the tool, else of the default list."""
        for rules in (self.tenants.get(tenant, ()), self.default):
            for rule in rules:
                if rule.covers(tool):
                    return rule
        return None


class PolicyError(ValueError):
    """The approval policy is not valid; the message says where and why."""


def _int_in(entry: Mapping[str, Any], name: str, default: int, low: int, high: int, where: str) -> int:
    value = entry.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PolicyError(f"{where}.{name} must be an integer from {low} to {high}")
    return value


def _rules(value: Any, where: str) -> tuple[ApprovalRule, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"{where} must be a list of rules")
    rules = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise PolicyError(f"{at} must be an object")
        unknown = sorted(set(entry) - _RULE_FIELDS)
        if unknown:
            raise PolicyError(f"{at} has unknown fields: {', '.join(unknown)}")
        tool = entry.get("tool")
        if not isinstance(tool, str) or not tool:
            raise PolicyError(f"{at}.tool must be a non-empty glob")
        required = _int_in(entry, "required", 1, 1, 3, at)
        ttl = _int_in(entry, "ttl_seconds", 900, 60, 86400, at)
        rules.append(ApprovalRule(tool, required, ttl))
    return tuple(rules)


def parse_policy(raw: str | None) -> ApprovalPolicy | None:
    """`APPROVAL_POLICY` (inline JSON, or the path of a JSON file) → the policy; absent → None."""
    if raw is None or not raw.strip():
        return None
    try:
        text = raw if raw.lstrip().startswith("{") else Path(raw).expanduser().read_text()
    except OSError as unreadable:
        raise PolicyError(f"cannot read the policy file: {unreadable.strerror}") from None
    try:
        table = json.loads(text)
    except json.JSONDecodeError as bad:
        raise PolicyError(f"not JSON (line {bad.lineno}, column {bad.colno})") from None
    if not isinstance(table, dict):
        raise PolicyError("must be a JSON object {'default': [rule...], 'tenants': {tenant: [rule...]}}")
    unknown = sorted(set(table) - {"default", "tenants"})
    if unknown:
        raise PolicyError(f"unknown fields: {', '.join(unknown)}")
    default = _rules(table.get("default", []), "default")
    tenants_raw = table.get("tenants", {})
    if not isinstance(tenants_raw, dict):
        raise PolicyError("tenants must be an object of tenant -> [rule...]")
    tenants = {str(t): _rules(rules, f"tenants[{t!r}]") for t, rules in tenants_raw.items()}
    return ApprovalPolicy(default, tenants)


def effective_status(status: str, expires_at: datetime, clock: datetime) -> str:
    """A live request whose validity has passed at `clock` is expired, whether or not it was rewritten."""
    return "expired" if status in LIVE and expires_at <= clock else status


def approval_view(row: Mapping[str, Any], clock: datetime) -> dict[str, Any]:
    """The approval view of API.md section 15 from a request row, its status by the database clock."""
    return {
        "approval_id": row["approval_id"],
        "operation_id": row["operation_id"],
        "principal": row["principal"],
        "tool": row["tool"],
        "tool_version": row["tool_version"],
        "intent_digest": row["intent_digest"],
        "intent": row["intent"],
        "note": row["note"],
        "status": effective_status(row["status"], row["expires_at"], clock),
        "required": row["required"],
        "decisions": [
            {"by": d["by"], "decision": d["decision"], "reason": d["reason"], "at": d["at"]}
            for d in row["decisions"]
        ],
        "requested_at": format_ts(row["requested_at"]),
        "expires_at": format_ts(row["expires_at"]),
        "consumed_by_attempt": row["consumed_by_attempt"],
    }


def row_from_json(value: Mapping[str, Any]) -> dict[str, Any]:
    """A request row as to_jsonb wrote it (timestamps as text) → the row as the driver reads it."""
    row = dict(value)
    for name in ("requested_at", "expires_at", "updated_at"):
        row[name] = datetime.fromisoformat(row[name])
    return row


def view_of(value: Mapping[str, Any] | None, clock: datetime) -> dict[str, Any] | None:
    """The approval view of a to_jsonb'd request row (None, or a row of nulls: no request)."""
    if value is None or value.get("approval_id") is None:
        return None
    return approval_view(row_from_json(value), clock)


def approval_event_hash(prev_hash: str, event: Mapping[str, Any]) -> str:
    """sha256_hex(prev_hash + "\\n" + JCS of the hashed fields), as migration 0011 computes it."""
    content = {name: event[name] for name in EVENT_HASHED_FIELDS}
    return hashlib.sha256(prev_hash.encode("ascii") + b"\n" + canonical_json(content)).hexdigest()


def chain_holds(events: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a request's events link from the genesis hash with every hash recomputed."""
    prev = GENESIS_HASH
    for expected_seq, event in enumerate(events, start=1):
        if event["seq"] != expected_seq or event["prev_hash"] != prev:
            return False
        if approval_event_hash(prev, event) != event["hash"]:
            return False
        prev = event["hash"]
    return True
