"""What handlers take from the request: the verified caller and the ledger of this process."""

from __future__ import annotations

from typing import Any

from litestar import Request

from effect_ledger.db.ledger import Ledger
from effect_ledger.domain.errors import DatabaseUnavailable
from effect_ledger.http.auth import EXECUTE, Caller, authenticate


def caller_of(request: Request[Any, Any, Any]) -> Caller:
    """The caller verified by the route's guard."""
    return authenticate(request)


def ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """The process's ledger over the runtime pool (executors)."""
    ledger: Ledger = request.app.state.ledger
    return ledger


def writing_ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """The ledger for executor writes (claim, submit, heartbeat, complete): refused with 503 and an
    incident while the database's receipts log is behind what the signer signed (API.md section 14:
    a restored backup never silently reopens an ID)."""
    refuse_while_log_behind(request)
    return ledger_of(request)


def refuse_while_log_behind(request: Request[Any, Any, Any]) -> None:
    """503 (with an incident) while the receipts log is behind the signer; every write checks it."""
    refuse_while_state_log_behind(request.app.state)


def refuse_while_state_log_behind(state: Any) -> None:
    """The same check on the app's state, for http.fastpath (no Request there); DatabaseUnavailable
    reaches the app's handler for it on both paths, which records the incident."""
    guard = getattr(state, "log_guard", None)
    refusal = None if guard is None else guard.refusal
    if refusal is not None:
        raise DatabaseUnavailable(
            refusal, "LogBehindSigner" if refusal == "log_behind_signer" else "LogNotChecked"
        )


def audit_ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """The ledger over the audit pool: reconciler and audit calls, never queued behind executors."""
    ledger: Ledger = request.app.state.audit_ledger
    return ledger


def reading_ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """For reads open to every audience: the audit pool unless the caller is an executor."""
    return ledger_of(request) if EXECUTE in caller_of(request).scopes else audit_ledger_of(request)
