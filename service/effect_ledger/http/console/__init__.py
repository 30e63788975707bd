"""The web console of docs/api.md section 13: server-rendered pages for operators and auditors.

It runs in the service's own process and calls the same repository functions as the API handlers;
the sign-in session is a sealed cookie carrying the token, verified by the API's verifier on every
request, so the console can never do more than the token could through `/v1`.
"""

from __future__ import annotations

from typing import Any

from litestar.static_files import create_static_files_router

from effect_ledger.http.console.actions import ConsoleActions
from effect_ledger.http.console.approvals import ConsoleApprovals
from effect_ledger.http.console.errors import ConsoleHeaders, console_aware
from effect_ledger.http.console.pages import ConsolePages
from effect_ledger.http.console.render import STATIC, template_config
from effect_ledger.http.console.session import Sealer, session_key

__all__ = ["CONSOLE_ROUTES", "ConsoleHeaders", "Sealer", "console_aware", "session_key", "template_config"]

CONSOLE_ROUTES: list[Any] = [
    ConsolePages,
    ConsoleActions,
    ConsoleApprovals,
    create_static_files_router(
        path="/console/static", directories=[STATIC], include_in_schema=False, name="console_static"
    ),
]
