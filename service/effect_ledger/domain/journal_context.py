"""Context replay: which records to send with a new model request, under a record and byte budget.

Deterministic and loss-accounted. Records are grouped into units that are kept or dropped whole (a
message; a call with its result when it has one), so no result is ever sent without its call nor a
call without its existing result. Unresolved calls are always kept. The other units are kept newest
first until the next one does not fit; when the next unit lies in a summary's range and the whole
range does not fit, the summary is sent in the range's place (if it fits) and the walk goes on below.
Once a unit did not fit, no older unit is kept, but the walk goes on for the summaries: one that
covers older omitted records still stands in for them where it fits (until round 36 the walk ended
there, and a summary that fit was left out behind a record that did not).
Every record not sent is counted in `omitted` (records and bytes), whether a
summary stands in for it or not; `summarized` names the ranges that summaries stand in for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from effect_ledger.domain.errors import LedgerError, invalid_history
from effect_ledger.domain.journal_records import record_bytes

Record = tuple[int, Mapping[str, Any]]  # (seq, record in stored form)


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen seqs (ascending), the loss accounting, and the calls still unresolved."""

    seqs: list[int]
    omitted_records: int
    omitted_bytes: int
    summarized: list[dict[str, int]]
    unresolved: list[str]


class _Budget:
    def __init__(self, records: int | None, size: int | None) -> None:
        self.records, self.bytes = records, size

    def fits(self, count: int, size: int) -> bool:
        return (self.records is None or count <= self.records) and (self.bytes is None or size <= self.bytes)

    def take(self, count: int, size: int) -> None:
        if self.records is not None:
            self.records -= count
        if self.bytes is not None:
            self.bytes -= size


def _units(records: Sequence[Record]) -> tuple[list[list[int]], list[list[int]], list[str]]:
    """(mandatory units, other units, unresolved call IDs): each unit a list of seqs."""
    result_of: dict[str, int] = {}
    for seq, record in records:
        if record["type"] == "tool_result":
            result_of[record["call_id"]] = seq
    mandatory: list[list[int]] = []
    others: list[list[int]] = []
    unresolved: list[str] = []
    for seq, record in records:
        kind = record["type"]
        if kind == "message":
            others.append([seq])
        elif kind == "tool_call":
            result = result_of.get(record["call_id"])
            if result is None:
                mandatory.append([seq])
                unresolved.append(record["call_id"])
            else:
                others.append([seq, result])
    return mandatory, others, unresolved


def select_context(
    records: Sequence[Record],
    max_records: int | None,
    max_bytes: int | None,
    sizes: Mapping[int, int] | None = None,
) -> Selection | LedgerError:
    """Select deterministically under the budget; unresolved calls beyond it alone → invalid_history.

    `sizes` (seq -> JCS bytes) as measured at append; absent, they are measured here."""
    ordered = sorted(records, key=lambda r: r[0])
    size = dict(sizes) if sizes is not None else {seq: record_bytes(dict(record)) for seq, record in ordered}
    mandatory, others, unresolved = _units(ordered)
    budget = _Budget(max_records, max_bytes)
    kept: set[int] = set()
    for unit in mandatory:
        cost = sum(size[s] for s in unit)
        if not budget.fits(len(unit), cost):
            return invalid_history([(unit[0], "the unresolved calls alone exceed max_records or max_bytes")])
        budget.take(len(unit), cost)
        kept.update(unit)
    summaries = [
        (seq, r["covers"]["from_seq"], r["covers"]["to_seq"])
        for seq, r in reversed(ordered)
        if r["type"] == "summary"
    ]  # newest first
    units = sorted(others, key=max, reverse=True)
    decided: set[int] = set()  # seqs a chosen summary stands in for
    used: list[tuple[int, int, int]] = []
    stopped = False  # a unit did not fit: no older record is kept, but a summary still stands in
    for unit in units:  # for the omitted records it covers, where it fits (API.md section 12)
        if unit[0] in decided:
            continue
        cover = _covering(unit, summaries, used, kept)
        if cover is not None and (stopped or not _fits_whole(budget, _seqs_in(units, cover), size)):
            # the newest summary holding the unit that fits stands in for its whole range
            fitting = _covering(unit, summaries, used, kept, lambda seq: budget.fits(1, size[seq]))
            if fitting is not None:
                budget.take(1, size[fitting[0]])
                used.append(fitting)
                decided.update(_seqs_in(units, fitting))
                continue
            stopped = True
        if stopped:
            continue
        cost = sum(size[s] for s in unit)
        if not budget.fits(len(unit), cost):
            stopped = True  # newest kept first: every older record is omitted (or summarized)
            continue
        budget.take(len(unit), cost)
        kept.update(unit)
    chosen = kept | {seq for seq, _, _ in used}
    omitted = [s for s, _ in ordered if s not in chosen]
    return Selection(
        sorted(chosen),
        len(omitted),
        sum(size[s] for s in omitted),
        [{"from_seq": first, "to_seq": last} for _, first, last in sorted(used, key=lambda t: t[1])],
        unresolved,
    )


def _seqs_in(units: list[list[int]], summary: tuple[int, int, int]) -> list[int]:
    """The seqs of the units a summary's range holds whole."""
    _, first, last = summary
    return [s for unit in units if all(first <= s <= last for s in unit) for s in unit]


def _fits_whole(budget: _Budget, seqs: list[int], size: Mapping[int, int]) -> bool:
    """Whether every one of these records fits the remaining budget."""
    return budget.fits(len(seqs), sum(size[s] for s in seqs))


def _covering(
    unit: list[int],
    summaries: list[tuple[int, int, int]],
    used: list[tuple[int, int, int]],
    kept: set[int],
    fits: Callable[[int], bool] = lambda seq: True,
) -> tuple[int, int, int] | None:
    """The newest summary whose range holds the unit, overlaps no chosen summary and no kept record,
    and `fits` (given the summary's seq)."""
    for summary in summaries:
        seq, first, last = summary
        if not all(first <= s <= last for s in unit) or not fits(seq):
            continue
        if any(first <= other_last and other_first <= last for _, other_first, other_last in used):
            continue
        if any(first <= s <= last for s in kept):
            continue
        return summary
    return None
