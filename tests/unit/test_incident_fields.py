"""The incident's fields have one definition, `domain.diagnostics.Incident`; every other place that spells
them out follows it: the table, the catalogue's statements, the SQL functions that write incidents, the
request body, the client's structs and the reader's view.

SQL is read from the catalogue and from schema/ledger.sql (the migrated schema, itself checked against
the migrations by the drift test), so a migration that adds a column without the domain fails here.
"""

from __future__ import annotations

from pathlib import Path

from effect_ledger.client.models import Diagnostics, IncidentRecord
from effect_ledger.db.catalogue import queries
from effect_ledger.domain.diagnostics import (
    INCIDENT_COLUMNS,
    REPORT_FIELDS,
    VIEW_FIELDS,
    Incident,
    incident_values,
    incident_view,
    reported_values,
)
from effect_ledger.http.schemas import DiagnosticsBody

LEDGER_SQL = (Path(__file__).resolve().parents[2] / "schema" / "ledger.sql").read_text("utf-8")
# Stored with the incident but not part of it: what makes a report idempotent (migration 0007).
REPORT_KEY_COLUMNS = ("report_key", "report_fingerprint")
COLUMNS = tuple("tenant_id" if c == "tenant" else c for c in INCIDENT_COLUMNS)


def _names(listing: str) -> list[str]:
    """The first word of each comma-separated item (a column list, or `name type` pairs)."""
    return [item.split()[0] for item in listing.replace("\n", " ").split(",") if item.strip()]


def _block(text: str, start: str, end: str) -> str:
    begin = text.index(start) + len(start)
    return text[begin : text.index(end, begin)]


def _function(name: str) -> str:
    return _block(LEDGER_SQL, f"CREATE FUNCTION {name}(", "$$;")


def test_the_domain_lists_the_reported_fields_in_contract_order() -> None:
    assert REPORT_FIELDS == (
        "operation_id",
        "attempt",
        "phase",
        "cause",
        "http_status",
        "provider",
        "provider_request_id",
        "retryable_hint",
        "elapsed_ms",
        "detail_code",
        "headers",
    )
    incident = Incident(tenant="t1", incident_id="inc_x", source="report", phase="connect", elapsed_ms=7)
    assert incident_values(incident)[:3] == ("t1", "inc_x", "report")
    assert dict(zip(REPORT_FIELDS, reported_values(incident), strict=True))["elapsed_ms"] == 7


def test_the_table_has_the_domain_columns() -> None:
    table = _block(LEDGER_SQL, "CREATE TABLE diagnostics.incidents (", "\n);")
    columns = [
        line.split()[0] for line in table.strip().splitlines() if not line.strip().startswith("CONSTRAINT")
    ]
    assert sorted(columns) == sorted((*COLUMNS, *REPORT_KEY_COLUMNS))


def test_the_catalogue_inserts_and_reads_the_domain_columns_in_order() -> None:
    inserted = _block(queries()["insert_incident"], "INSERT INTO diagnostics.incidents (", ")")
    assert tuple(_names(inserted)) == COLUMNS  # the parameters are incident_values(), in this order
    selected = _block(queries()["read_incident"], "SELECT", "FROM")
    aliases = [item.split()[-1] for item in selected.replace("\n", " ").split(",")]
    assert sorted(aliases) == sorted(INCIDENT_COLUMNS)
    arguments = _block(queries()["store_report"], "diagnostics.store_report(", ")")
    assert len(arguments.split(",")) == 4 + len(REPORT_FIELDS)  # id, principal, key, fingerprint, fields


def test_the_sql_functions_that_write_incidents_take_the_domain_fields() -> None:
    store_report = _function("diagnostics.store_report")
    parameters = _names(store_report[: store_report.index(") RETURNS")])
    assert parameters == ["p_incident_id", "p_principal", "p_report_key", "p_fingerprint"] + [
        f"p_{name}" for name in REPORT_FIELDS
    ]
    # complete(unknown) stores its diagnostics from the incident as jsonb (db.ledger: asdict(Incident));
    # the tenant and the attempt come from the locked row, not from the record.
    complete = _function("ledger.complete")
    inserted = _block(complete, "INSERT INTO diagnostics.incidents (", ")")
    assert tuple(_names(inserted)) == COLUMNS
    record = _block(complete, "jsonb_to_record(incident) AS i(", ");")
    assert sorted(_names(record)) == sorted(set(INCIDENT_COLUMNS) - {"tenant", "attempt"})


def test_the_request_body_and_the_client_take_the_reported_fields() -> None:
    assert DiagnosticsBody.__struct_fields__ == (*REPORT_FIELDS, "report_id")
    assert Diagnostics.__struct_fields__ == (*REPORT_FIELDS, "report_id")


def test_the_reader_view_and_the_client_record_have_the_same_fields() -> None:
    assert "tenant" not in VIEW_FIELDS and IncidentRecord.__struct_fields__ == VIEW_FIELDS
    row = {name: None for name in INCIDENT_COLUMNS} | {"created_at": None, "incident_id": "inc_x"}
    assert tuple(incident_view(row)) == VIEW_FIELDS
