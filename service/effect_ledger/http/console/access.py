"""What a console request may do: the signed-in session, its scopes, the CSRF check, safe redirects."""

from __future__ import annotations

import re
from typing import Any

from litestar import Request

from effect_ledger.domain.errors import LedgerError
from effect_ledger.http.console.session import ConsoleSession, current_session, same

_NEXT = re.compile(r"^/console(/[A-Za-z0-9._:~/-]*)?\Z")


class CsrfRejected(Exception):
    """A state-changing form arrived without this session's CSRF token."""


def signed_in(request: Request[Any, Any, Any], *scopes: str) -> ConsoleSession:
    """The session of a signed-in user holding any of `scopes` (none named: any signed-in user)."""
    session = current_session(request)
    if scopes and session.caller.scopes.isdisjoint(scopes):
        raise LedgerError("forbidden", "This page needs " + " or ".join(scopes) + ", which your token lacks.")
    return session


def holds(session: ConsoleSession, *scopes: str) -> bool:
    """True when the session's token holds any of `scopes`."""
    return not session.caller.scopes.isdisjoint(scopes)


async def checked_form(request: Request[Any, Any, Any], session: ConsoleSession) -> dict[str, str]:
    """The posted form, after its CSRF token is checked against the session's."""
    form = await request.form()
    fields = {name: str(value) for name, value in form.items() if isinstance(value, str)}
    if not same(fields.get("csrf"), session.csrf):
        raise CsrfRejected
    return fields


def safe_next(value: str | None) -> str:
    """Where to go after signing in: only a console path of this site, never another origin, and no
    dot segment (until round 36 `/console/../v1/x` matched, and the browser resolved it out of the
    console)."""
    if value and _NEXT.match(value) and "//" not in value and not {".", ".."} & set(value.split("/")):
        return value
    return "/console/"
