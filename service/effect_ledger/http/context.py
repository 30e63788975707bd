"""What handlers take from the request: the verified caller and the ledger of this process."""

from __future__ import annotations

from typing import Any

from litestar import Request

from effect_ledger.db.ledger import Ledger
from effect_ledger.http.auth import EXECUTE, Caller, authenticate


def caller_of(request: Request[Any, Any, Any]) -> Caller:
    """The caller verified by the route's guard."""
    return authenticate(request)


def ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """The process's ledger over the runtime pool (executors)."""
    ledger: Ledger = request.app.state.ledger
    return ledger


def audit_ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """The ledger over the audit pool: reconciler and audit calls, never queued behind executors."""
    ledger: Ledger = request.app.state.audit_ledger
    return ledger


def reading_ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """For reads open to every audience: the audit pool unless the caller is an executor."""
    return ledger_of(request) if EXECUTE in caller_of(request).scopes else audit_ledger_of(request)
