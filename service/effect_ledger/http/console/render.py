"""Rendering console pages: the template engine, its filters, and the context every page shares."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from litestar import Request
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.template import TemplateConfig

from effect_ledger.domain.timefmt import parse_ts
from effect_ledger.http.auth import APPROVE, AUDIT, DIAG_READ, RECONCILE
from effect_ledger.http.console.session import ConsoleSession

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")

# (path, label, scopes that open it): the navigation shows only what the token may see.
NAV: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("/console/unknown", "Unknown queue", frozenset({RECONCILE, AUDIT})),
    ("/console/operations", "Operations", frozenset({RECONCILE, AUDIT})),
    ("/console/receipts", "Receipts", frozenset({AUDIT})),
    ("/console/incidents", "Incidents", frozenset({DIAG_READ})),
    ("/console/access-log", "Access log", frozenset({AUDIT})),
    ("/console/approvals", "Approvals", frozenset({APPROVE})),
)


def _moment(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    try:
        return parse_ts(str(value))
    except ValueError:
        return None


def utc(value: Any) -> str:
    """`2026-11-30 10:00:30 UTC` (seconds are enough for people; the API keeps milliseconds)."""
    moment = _moment(value)
    return "—" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: Any) -> str:
    """The machine-readable form for a <time datetime=…> attribute."""
    moment = _moment(value)
    return (
        "" if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


def age(value: Any, now: datetime | None = None) -> str:
    """How long ago (or, for a future moment, how long until), in the largest sensible unit."""
    moment = _moment(value)
    if moment is None:
        return ""
    seconds = int(((now or datetime.now(UTC)) - moment).total_seconds())
    ahead, seconds = seconds < 0, abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            amount = f"{seconds // size} {unit}"
            break
    else:
        amount = f"{seconds} s"
    return f"in {amount}" if ahead else f"{amount} ago"


def timeof(epoch_seconds: int) -> str:
    """A moment given in seconds since the epoch (a token's exp), in UTC with its distance from now."""
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return f"{utc(moment)} ({age(moment)})"


def pretty_json(value: Any) -> str:
    """JSON for people: indented, keys in order."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _engine_callback(engine: JinjaTemplateEngine) -> None:
    engine.engine.filters.update({"utc": utc, "iso": iso, "age": age, "pretty_json": pretty_json})
    engine.engine.globals["timeof"] = timeof


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    """Litestar's Jinja2 template support over the console's own templates (autoescaped)."""
    return TemplateConfig(directory=TEMPLATES, engine=JinjaTemplateEngine, engine_callback=_engine_callback)


def nav_for(scopes: frozenset[str]) -> list[tuple[str, str]]:
    """The navigation links this token's scopes open."""
    return [(path, label) for path, label, needs in NAV if not needs.isdisjoint(scopes)]


def page(
    request: Request[Any, Any, Any],
    template: str,
    session: ConsoleSession | None,
    *,
    status: int = 200,
    title: str = "",
    **context: Any,
) -> Template:
    """A console page with the shared context: who is signed in, the navigation, the CSRF token."""
    shared = {
        "title": title,
        "session": session,
        "caller": None if session is None else session.caller,
        "nav": [] if session is None else nav_for(session.caller.scopes),
        "csrf": None if session is None else session.csrf,
        "current_path": request.url.path,
        "now": datetime.now(UTC),
        "status_code": status,
    }
    return Template(template_name=template, context={**shared, **context}, status_code=status)
