"""What the client's call groups (approvals, the journal, the receipts log) need of LedgerClient: its one
request path and its decoder. A Protocol, so client.py can import those modules without a cycle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

import httpx

from effect_ledger.client.retry import RetryPolicy

T = TypeVar("T")


class Transport(Protocol):
    """LedgerClient.request and LedgerClient.decode."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int] | None = None,
        retry: RetryPolicy | None = None,
        authenticated: bool = True,
    ) -> httpx.Response: ...

    def decode(self, response: httpx.Response, kind: type[T]) -> T: ...
