"""Journal telemetry (API.md section 12): counters per call and outcome, and content-free log lines.

Labels are bounded by the code (call names, outcomes, problem codes); a log line carries the session
ID, the revision, the reducer and counts, never a record's content, arguments or output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from effect_ledger.domain.errors import LedgerError

CALLS = ("create", "load", "append", "projection", "context", "delete")
log = structlog.get_logger("effect_ledger.journal")


class JournalMetrics:
    """The journal's series, in the app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "effect_ledger_journal_calls",
            "Journal calls answered, by call and outcome (ok, replayed, or the problem code: "
            "revision_conflict, invalid_history, unsupported_schema, not_found...).",
            ["call", "outcome"],
            registry=registry,
        )
        self.omitted = Counter(
            "effect_ledger_journal_context_omitted_records",
            "Records left out of context selections (counted in each answer's `omitted`).",
            registry=registry,
        )
        self.unresolved = Counter(
            "effect_ledger_journal_unresolved_calls_seen",
            "Unresolved calls seen by projections.",
            registry=registry,
        )
        self.summaries = Counter(
            "effect_ledger_journal_summaries_appended",
            "Summary (compaction) records accepted.",
            registry=registry,
        )
        for call in CALLS:  # every call has a series from the start, so rates never lack one
            self.calls.labels(call, "ok")

    @asynccontextmanager
    async def observe(self, call: str, **fields: Any) -> AsyncIterator[dict[str, Any]]:
        """Count the call's outcome and log one line; the block adds fields (revision, counts...)."""
        line: dict[str, Any] = dict(fields)
        try:
            yield line
        except LedgerError as exc:
            self.calls.labels(call, exc.code).inc()
            log.info("journal_" + call, outcome=exc.code, **_safe(line, exc))
            raise
        outcome = line.pop("outcome", "ok")
        self.calls.labels(call, outcome).inc()
        log.info("journal_" + call, outcome=outcome, **line)


def _safe(line: dict[str, Any], exc: LedgerError) -> dict[str, Any]:
    """The line plus what a refusal may say in a log: its current revision, never the problem's text."""
    revision = exc.extensions.get("revision")
    return {**line, "revision": revision} if isinstance(revision, int) else line
