"""Incident references for 5xx answers: the caller gets only the reference, operators get the details."""

from __future__ import annotations

import secrets
from typing import Any

import structlog
from litestar import Request

log = structlog.get_logger("effect_ledger.incidents")


def new_incident_id() -> str:
    """An unguessable incident reference."""
    return "inc_" + secrets.token_urlsafe(18)


async def record_incident(request: Request[Any, Any, Any], exception_type: str, phase: str, status: int) -> str:
    """Record what an operator needs (never message text, bodies or header values); return the reference."""
    incident = new_incident_id()
    route = request.scope.get("path_template") or "unmatched"
    log.error(
        "incident", incident=incident, exception_type=exception_type, phase=phase, status=status,
        route=route, method=request.method,
    )
    return incident
