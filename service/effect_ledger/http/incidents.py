"""Incident references for 5xx answers: the caller gets only the reference, operators get the details.

Every 500 and 503 stores an incident (source `error`) holding the exception's type, the route
template, the method, the phase and the status: never a message, a body or a header value. The
write runs as the answer's background task; when the database itself is what failed, the incident
waits in the process's bounded spool and is written once the database is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import structlog
from litestar import Litestar, Request
from litestar.background_tasks import BackgroundTask

from effect_ledger.db.diagnostics import IncidentRecorder
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.pools import SHED_PHASE
from effect_ledger.domain.diagnostics import Incident, new_incident_id
from effect_ledger.http.schemas import OPERATION_ID

log = structlog.get_logger("effect_ledger.incidents")

FLUSH_INTERVAL_SECONDS = 1.0
SHUTDOWN_FLUSH_SECONDS = 2.0
_METHOD = re.compile(r"^[A-Z]{1,16}\Z")


async def store_incident(app_state: Any, incident: Incident) -> None:
    """Log the incident's controlled fields and store it (or spool it while the database is down).

    A shed request's incident goes to the spool straight away: the database is overloaded, and the
    spool's flusher writes one incident at a time instead of one more write per refused request.
    """
    log.error(
        "incident",
        incident=incident.incident_id,
        exception_type=incident.exception_type,
        phase=incident.phase,
        status=incident.http_status,
        route=incident.route,
        method=incident.method,
    )
    recorder: IncidentRecorder | None = getattr(app_state, "incidents", None)
    if recorder is None:
        return
    if incident.phase == SHED_PHASE:
        recorder.defer(incident, "shed")
    else:
        await recorder.record(incident)


def error_incident(request: Request[Any, Any, Any], exception_type: str, phase: str, status: int) -> Incident:
    """The controlled facts of a failed request; tenant '' when no verified caller is known."""
    caller = request.scope.get("effect_ledger.caller")
    path_params = request.scope.get("path_params") or {}
    operation_id = path_params.get("operation_id")
    if not (isinstance(operation_id, str) and OPERATION_ID.match(operation_id)):
        operation_id = None
    return Incident(
        tenant=getattr(caller, "tenant", ""),
        incident_id=new_incident_id(),
        source="error",
        principal=getattr(caller, "principal", None),
        operation_id=operation_id,
        phase=phase,
        http_status=status,
        # The template ("/v1/operations/{operation_id}/claim"), never the concrete path.
        route=str(request.scope.get("path_template") or "unmatched"),
        method=request.method if _METHOD.match(request.method) else "other",
        exception_type=exception_type,
        created_at=datetime.now(UTC),  # when it happened, even if it is written later from the spool
    )


def record_incident(
    request: Request[Any, Any, Any], exception_type: str, phase: str, status: int
) -> tuple[str, BackgroundTask]:
    """Create an incident for a 5xx answer; returns its reference and the task that stores it.

    Litestar's exception handlers are synchronous, so the write happens as the answer's background task.
    """
    incident = error_incident(request, exception_type, phase, status)
    return incident.incident_id, BackgroundTask(store_incident, request.app.state, incident)


@asynccontextmanager
async def incident_spool(app: Litestar) -> AsyncIterator[None]:
    """Lifespan part: the incident recorder over the runtime pool, and its spool flusher."""
    ledger: Ledger = app.state.ledger
    recorder = IncidentRecorder(ledger)
    app.state.incidents = recorder
    flusher = asyncio.create_task(recorder.run(FLUSH_INTERVAL_SECONDS))
    try:
        yield
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        if recorder.spool:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(recorder.flush(), SHUTDOWN_FLUSH_SECONDS)
        if recorder.spool:
            log.error("incident_spool_lost", incidents=[i.incident_id for i in recorder.spool])
