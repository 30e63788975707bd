"""Chain verification for auditors: the hash chain itself, and its head agreeing with the operation row."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from effect_ledger.domain.chain import GENESIS_HASH, first_bad_seq


@dataclass(frozen=True, slots=True)
class ChainVerdict:
    """Events checked and the first bad seq (None: the chain holds)."""

    checked: int
    first_bad_seq: int | None

    @property
    def ok(self) -> bool:
        """Whether the chain holds."""
        return self.first_bad_seq is None


def verify_chain(
    events: Sequence[Mapping[str, Any]],
    status: str,
    attempt: int,
    base_seq: int = 0,
    base_hash: str = GENESIS_HASH,
    head_hash: str | None = None,
    format_at: Callable[[Any], Any] | None = None,
) -> ChainVerdict:
    """Recompute every link; then the head must record the row's status and attempt, and be the row's
    chain head (`head_hash`, when given: the hash the row, its receipt and its log leaf name).

    Every state change appends an event whose to_status and attempt are the new state's, so a head that
    disagrees with the row means events were removed from the end (the first missing seq is reported),
    which the hashes alone cannot show. An operation without any event lost its first one, unless a
    purge cut its chain (base_seq, base_hash): then the events after that point must link onto it.
    `format_at`: as first_bad_seq's (events given as database rows).
    """
    checked, bad = first_bad_seq(events, base_seq, base_hash, format_at)
    if bad is not None:
        return ChainVerdict(checked, bad)
    if not events:
        # a tombstone keeps no events: its chain is the point the purge cut it at
        return ChainVerdict(0, None if base_seq else 1)
    head = events[-1]
    agrees = head["to_status"] == status and head["attempt"] == attempt
    if not agrees or (head_hash is not None and head["hash"] != head_hash):  # or the row names another head
        return ChainVerdict(checked, int(head["seq"]) + 1)
    return ChainVerdict(checked, None)
