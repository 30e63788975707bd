"""What handlers take from the request: the verified caller and the ledger of this process."""

from __future__ import annotations

from typing import Any

from litestar import Request

from effect_ledger.db.ledger import Ledger
from effect_ledger.http.auth import Caller, authenticate


def caller_of(request: Request[Any, Any, Any]) -> Caller:
    """The caller verified by the route's guard."""
    return authenticate(request)


def ledger_of(request: Request[Any, Any, Any]) -> Ledger:
    """The process's ledger (runtime pool)."""
    ledger: Ledger = request.app.state.ledger
    return ledger
