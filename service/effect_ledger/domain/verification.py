"""Chain verification for auditors: the hash chain itself, and its head agreeing with the operation row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from effect_ledger.domain.chain import first_bad_seq


@dataclass(frozen=True, slots=True)
class ChainVerdict:
    """Events checked and the first bad seq (None: the chain holds)."""

    checked: int
    first_bad_seq: int | None

    @property
    def ok(self) -> bool:
        """Whether the chain holds."""
        return self.first_bad_seq is None


def verify_chain(events: Sequence[Mapping[str, Any]], status: str, attempt: int) -> ChainVerdict:
    """Recompute every link; then the head must record the row's status and attempt.

    Every state change appends an event whose to_status and attempt are the new state's, so a head that
    disagrees with the row means events were removed from the end (the first missing seq is reported),
    which the hashes alone cannot show. An operation without any event lost its first one.
    """
    checked, bad = first_bad_seq(events)
    if bad is not None:
        return ChainVerdict(checked, bad)
    if not events:
        return ChainVerdict(0, 1)
    head = events[-1]
    if head["to_status"] != status or head["attempt"] != attempt:
        return ChainVerdict(checked, int(head["seq"]) + 1)
    return ChainVerdict(checked, None)
