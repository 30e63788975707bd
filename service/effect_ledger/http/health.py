"""Liveness (no database), readiness (a writable primary, migrations at head, the primary's switches)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from effect_ledger.db.health import database_ready


@get("/livez", include_in_schema=True, tags=["operations"])
async def livez() -> dict[str, str]:
    """The process is alive; never touches the database, so a database blip restarts no pod."""
    return {"status": "ok"}


@get("/readyz", tags=["operations"])
async def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Ready when the runtime pool reaches a writable primary and the schema is at the newest migration.

    `checks` also says which server serves (`server`, `timeline`), how often the primary changed since
    start-up (`primary_switches`, `switched_at`) and, during an outage, since when (`lost_at`)."""
    watcher = getattr(request.app.state.pools, "server", None)
    ok, checks = await database_ready(request.app.state.ledger, request.app.state.migration_head, watcher)
    guard = getattr(request.app.state, "log_guard", None)
    refusal = None if guard is None else guard.refusal
    if refusal is not None:  # API.md section 14: a restored backup stops writes (so does not knowing)
        ok = False
        checks = {**checks, "log": refusal}
    return Response(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503
    )
