"""What every measured executor sends: one identity, one tool, and the bodies of one effect cycle.

Kept free of heavy imports: the load-generator processes import it.
"""

from __future__ import annotations

from typing import Any

TENANT = "bench"
BULK_TENANT = "bench-bulk"  # growth history lives beside the measured tenant, in the same tables
PRINCIPAL = "bench-exec"  # executor replicas of one deployment share a principal; each has its own token
TOOL = "bench.transfer"
TOOL_VERSION = "1.0.0"
LEASE_SECONDS = 30
SCOPE = "ledger:execute"


def claim_path(op_id: str, call: str) -> str:
    """The executor call's path for one operation."""
    return f"/v1/operations/{op_id}/{call}"


def claim_body(op_id: str, nonce: str) -> dict[str, Any]:
    """A claim with a small intent (hashed by the service) and a client nonce, as careful executors send."""
    return {
        "tool": TOOL,
        "tool_version": TOOL_VERSION,
        "intent": {"op": op_id, "amount_cents": 1250, "currency": "EUR"},
        "lease_seconds": LEASE_SECONDS,
        "client_nonce": nonce,
    }


def submit_body(token: str, op_id: str) -> dict[str, Any]:
    """Mark the effect as about to be sent."""
    return {"token": token, "effect_ref": f"ref-{op_id}"}


def complete_body(token: str, op_id: str) -> dict[str, Any]:
    """Record the effect as committed with the remote system's reference."""
    return {"token": token, "outcome": "committed", "receipt": {"external_ref": f"rcpt-{op_id}"}}
