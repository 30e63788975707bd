"""Protected diagnostics of docs/api.md section 9: report an incident, read one with a stated purpose."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody

from effect_ledger.db import diagnostics as repo
from effect_ledger.db.pools import Pools
from effect_ledger.domain.diagnostics import (
    INCIDENT_ID,
    Incident,
    ReportKey,
    Source,
    check_purpose,
    new_incident_id,
    normalise_headers,
    report_key,
    screen,
)
from effect_ledger.domain.errors import not_found, validation_failed
from effect_ledger.domain.model import UNKNOWN
from effect_ledger.http.auth import DIAG_READ, DIAG_WRITE, Caller, requires
from effect_ledger.http.context import caller_of, ledger_of
from effect_ledger.http.schemas import CompleteBody, DiagnosticsBody, strict, to_builtins

DIAGNOSTICS_PATH = "/v1/diagnostics"


def incident_from_body(
    caller: Caller, body: DiagnosticsBody, source: Source, field: str = ""
) -> tuple[Incident, ReportKey | None]:
    """An incident from reported fields: header names checked, every value screened for credentials;
    with a report_id, the key that makes a retried report idempotent (the ID is an opaque key:
    hashed, never stored, so it is not screened)."""
    values = {name: value for name, value in to_builtins(body).items() if value is not None}
    report_id = values.pop("report_id", None)
    if not values:
        raise validation_failed([(field.rstrip(".") or "body", "report at least one diagnostics field")])
    values["headers"] = normalise_headers(values.get("headers"), f"{field}headers")
    screen(values, field)
    incident = Incident(
        tenant=caller.tenant,
        incident_id=new_incident_id(),
        source=source,
        principal=caller.principal,
        **values,
    )
    return incident, None if report_id is None else report_key(report_id, values)


def outcome_incident(caller: Caller, operation_id: str, body: CompleteBody) -> Incident | None:
    """complete's `diagnostics` as an incident (source `outcome`); only an unknown outcome carries them."""
    if body.diagnostics is None:
        return None
    if body.outcome != UNKNOWN:
        raise validation_failed([("diagnostics", "only an unknown outcome carries diagnostics")])
    if body.diagnostics.operation_id not in (None, operation_id):
        raise validation_failed([("diagnostics.operation_id", "must be the operation being completed")])
    if body.diagnostics.report_id is not None:
        raise validation_failed([("diagnostics.report_id", "only POST /v1/diagnostics takes a report_id")])
    incident, _ = incident_from_body(caller, body.diagnostics, "outcome", "diagnostics.")
    return replace(incident, operation_id=operation_id)


class DiagnosticsController(Controller):
    """Report incidents (diagnostics:write) and read them, every read recorded (diagnostics:read)."""

    path = DIAGNOSTICS_PATH
    tags = ("diagnostics",)

    @post(
        "/",
        guards=[requires(DIAG_WRITE)],
        status_code=201,
        responses={
            200: ResponseSpec(
                dict[str, Any],
                description="the same report_id again: the first answer's incident (Idempotent-Replayed)",
                generate_examples=False,
            )
        },
        **strict(DiagnosticsBody),
    )
    async def report(self, request: Request[Any, Any, Any], data: JSONBody[DiagnosticsBody]) -> Response[Any]:
        """Store an incident from the allow-listed fields; a credential-shaped value stores nothing."""
        incident, report = incident_from_body(caller_of(request), data, "report")
        if report is None:
            await repo.store_incident(ledger_of(request), incident, "diagnostics_report")
            return Response({"incident": incident.incident_id}, status_code=201)
        first = await repo.store_report(ledger_of(request), incident, report)
        if first is None:
            return Response({"incident": incident.incident_id}, status_code=201)
        return Response({"incident": first}, status_code=200, headers={"Idempotent-Replayed": "true"})

    # `/v1/diagnostics/access-log` (the auditors' list) is a static route in the audit controller;
    # Litestar matches static segments before this parameter, which a test pins down.
    @get("/{incident:str}", guards=[requires(DIAG_READ)])
    async def read(
        self, request: Request[Any, Any, Any], incident: FromPath[str], purpose: FromQuery[str | None] = None
    ) -> Response[Any]:
        """One incident of the caller's tenant; the read and its purpose are logged in the same commit."""
        caller = caller_of(request)
        stated = check_purpose(purpose)
        if not INCIDENT_ID.match(incident):
            raise not_found("incident")
        pools: Pools = request.app.state.pools
        view = await repo.read_incident(
            pools.reader, pools.acquire_timeout, caller.tenant, caller.principal, incident, stated
        )
        return Response(view)
