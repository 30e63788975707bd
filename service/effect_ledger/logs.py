"""structlog: JSON to stdout, contextvars first, secrets redacted before rendering."""

from __future__ import annotations

import logging
import sys

import structlog

from effect_ledger.domain.redaction import redact_secrets


def configure_logging(level: str = "info") -> None:
    """Configure structlog (and stdlib logging underneath) once per process."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    logging.basicConfig(level=numeric, stream=sys.stdout, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
