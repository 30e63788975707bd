"""structlog: JSON lines to stdout (or lines for people on a terminal), secrets redacted before rendering.

Everything goes one way, the service's own events and what the standard library's loggers (uvicorn,
asyncpg) say: JSON, so one log pipeline parses all of it, unless stdout is a terminal (or
EFFECT_LEDGER_LOG_FORMAT=console), where structlog's console renderer writes for people.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

from effect_ledger.domain.redaction import redact_secrets, redact_value


class _CurrentStdout:
    """sys.stdout as it is at each write: pytest swaps it per test, and a bound stream would go stale."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


STDOUT: Any = _CurrentStdout()
_ENCODER = msgspec.json.Encoder(enc_hook=repr)  # what msgspec cannot encode is logged as its repr()


def _dumps(event: Any, **_: Any) -> str:
    """JSON text of one event: msgspec (about ten times cheaper than the standard library's json)."""
    return _ENCODER.encode(event).decode("utf-8")


_RENDER = structlog.processors.JSONRenderer(serializer=_dumps)

# Shared by structlog events and stdlib records, so both carry the same fields.
_PRE_CHAIN: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


class _JsonHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one root handler this module installs (recognised, and replaced, on reconfiguration)."""


def level_number(level: str) -> int:
    """The numeric level for a name such as "info" (INFO for anything unknown)."""
    numeric = logging.getLevelName(level.upper())
    return numeric if isinstance(numeric, int) else logging.INFO


def for_people(log_format: str = "auto") -> bool:
    """Whether log lines are rendered for people: `console`, or `auto` with stdout on a terminal."""
    return log_format == "console" or (log_format == "auto" and sys.stdout.isatty())


class _Lines:
    """How the request summary line is written: the level it needs, and whether JSON lines are on."""

    level = logging.INFO
    json = True


LINES = _Lines()


def summary_enabled(level: int) -> bool:
    """Whether a summary line at `level` (logging.INFO, logging.DEBUG) is written at all."""
    return level >= LINES.level


def write_summary(
    level: int,
    event: str,
    fields: dict[str, Any],
    untrusted: tuple[str, ...],
    context: dict[str, Any] | None = None,
) -> None:
    """One request summary line in a single pass: the same JSON object the structlog chain writes
    (the fields, the bound context, `event`, `level`, `timestamp`, redacted), built directly. Only the
    fields named in `untrusted` (and every context value) can carry caller text, so only they go
    through redaction; the others are controlled (route templates, methods, statuses, codes,
    durations). For people (the console renderer), the line takes the ordinary structlog path."""
    if not LINES.json:
        logger = structlog.get_logger("effect_ledger.http")
        (logger.info if level >= logging.INFO else logger.debug)(event, **fields)
        return
    for key in untrusted:
        value = fields[key]
        if isinstance(value, str):
            fields[key] = redact_value(value)
    bound = structlog.contextvars.get_contextvars() if context is None else context  # read once by the caller
    for key, value in bound.items():
        if key not in fields:
            fields[key] = value if value is None or isinstance(value, int | float) else redact_value(value)
    fields["event"] = event
    fields["level"] = "info" if level >= logging.INFO else "debug"
    fields["timestamp"] = _STAMP.now()
    out = sys.stdout  # as it is now (see _CurrentStdout)
    out.write(_ENCODER.encode(fields).decode("utf-8") + "\n")
    out.flush()


class _Stamp:
    """The summary line's timestamp, `datetime.now(UTC).isoformat()` with `Z` for `+00:00`, its
    date-and-second part built once per second (isoformat costs more than the rest of the line)."""

    def __init__(self) -> None:
        self.second = -1
        self.prefix = ""

    def now(self) -> str:
        second, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
        if second != self.second:
            self.prefix = datetime.fromtimestamp(second, UTC).isoformat()[:-6]  # without +00:00
            self.second = second
        micro = nanoseconds // 1000  # datetime.now floors to the microsecond too
        return f"{self.prefix}.{micro:06d}Z" if micro else f"{self.prefix}Z"  # isoformat omits .000000


_STAMP = _Stamp()


def configure_logging(level: str = "info", log_format: str = "auto") -> None:
    """Configure structlog and the stdlib root logger; safe to call again (the last call wins)."""
    numeric = level_number(level)
    renderer: Any = structlog.dev.ConsoleRenderer(colors=True) if for_people(log_format) else _RENDER
    LINES.level, LINES.json = numeric, renderer is _RENDER
    structlog.configure(
        processors=[*_PRE_CHAIN, redact_secrets, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(STDOUT),
        # Not cached: a later configure_logging (another app in the same process, as in tests)
        # must take effect for module-level loggers too; re-binding costs microseconds per line.
        cache_logger_on_first_use=False,
    )
    handler = _JsonHandler(STDOUT)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                redact_secrets,
                renderer,
            ],
            foreign_pre_chain=[*_PRE_CHAIN, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _JsonHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries (uvicorn, asyncpg, alembic, pgserver) chatter at info: only their warnings and errors,
    # unless the service itself runs at debug.
    root.setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))
