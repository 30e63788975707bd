"""Operation IDs that survive the model retrying, the intent, the tool version, injected arguments.

Pure functions over JSON values (API.md section 16): a retried `tools/call` with the same meaningful
arguments derives the same operation ID, so the ledger answers it instead of the upstream.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from effect_ledger.domain.canonical import canonical_json, intent_digest
from effect_ledger.domain.model import OPERATION_ID_PATTERN

OPERATION_ID_META = "effect-ledger/operation_id"
RUN_ID_META = "effect-ledger/run_id"
OPERATION_META = "effect-ledger/operation"
REPLAYED_META = "effect-ledger/replayed"
OPERATION_ID = re.compile(OPERATION_ID_PATTERN)
DERIVED_PREFIX = "mcp-"
DERIVED_HEX = 48


class InvalidOperationId(ValueError):
    """The host's `_meta` names an operation ID the ledger would refuse."""


@dataclass(frozen=True, kw_only=True)
class Identity:
    """What one wrapped call is, for the ledger and for the upstream."""

    operation_id: str
    derived: bool  # False: the host set it in `_meta`
    intent: dict[str, Any]  # the arguments without the volatile and injected ones
    forwarded: dict[str, Any]  # the arguments the upstream receives (injected values in place)
    effect_ref: str | None  # the first injected value: what the upstream knows the call by


def tool_version(input_schema: Mapping[str, Any]) -> str:
    """`sha256:` of the JCS of the tool's input schema: a changed schema is another tool version."""
    return intent_digest(dict(input_schema))


def derive_operation_id(run: str | None, server: str, tool: str, intent: Mapping[str, Any]) -> str:
    """`mcp-` + the first 48 hex of SHA-256 over the JCS of {run, server, tool, arguments}."""
    document = {"run": run, "server": server, "tool": tool, "arguments": dict(intent)}
    return DERIVED_PREFIX + hashlib.sha256(canonical_json(document)).hexdigest()[:DERIVED_HEX]


def _meta_string(meta: Mapping[str, Any] | None, key: str) -> str | None:
    value = (meta or {}).get(key)
    return value if isinstance(value, str) else None


def identify(
    *,
    server: str,
    tool: str,
    arguments: Mapping[str, Any] | None,
    meta: Mapping[str, Any] | None,
    config_run_id: str | None,
    left_out: frozenset[str],
    inject: Mapping[str, str],
) -> Identity:
    """The operation ID (the host's `_meta` key, else derived), intent and forwarded arguments.

    Only `_meta` (set by the host, never by the model) can name an operation ID or a run; nothing in
    the tool's arguments can."""
    given = dict(arguments or {})
    intent = {name: value for name, value in given.items() if name not in left_out}
    explicit = (meta or {}).get(OPERATION_ID_META)
    if explicit is not None:
        if not isinstance(explicit, str) or not OPERATION_ID.match(explicit):
            raise InvalidOperationId(f"_meta[{OPERATION_ID_META!r}] must be 1-200 of [A-Za-z0-9._:~-]")
        operation_id, derived = explicit, False
    else:
        run = _meta_string(meta, RUN_ID_META) or config_run_id
        operation_id, derived = derive_operation_id(run, server, tool, intent), True
    forwarded = dict(given)
    effect_ref = None
    for name, template in inject.items():
        value = template.replace("{operation_id}", operation_id)
        forwarded[name] = value
        effect_ref = effect_ref or value[:256]
    return Identity(
        operation_id=operation_id, derived=derived, intent=intent, forwarded=forwarded, effect_ref=effect_ref
    )
