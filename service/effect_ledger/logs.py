"""structlog: JSON lines to stdout, contextvars first, secrets redacted before rendering.

Everything is JSON, the service's own events and what the standard library's loggers (uvicorn,
asyncpg) say, so one log pipeline parses all of it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog

from effect_ledger.domain.redaction import redact_secrets


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


def configure_logging(level: str = "info") -> None:
    """Configure structlog and the stdlib root logger; safe to call again (the last call wins)."""
    numeric = level_number(level)
    structlog.configure(
        processors=[*_PRE_CHAIN, redact_secrets, _RENDER],
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
                _RENDER,
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
