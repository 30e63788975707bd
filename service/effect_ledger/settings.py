"""One typed settings object, read from EFFECT_LEDGER_* once at start-up; CLI flags mirror the names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

PREFIX = "EFFECT_LEDGER_"


@dataclass(frozen=True)
class Settings:
    """Every setting of the service; each field is EFFECT_LEDGER_<FIELD> and `--<field>` on serve."""

    database_url: str | None = None  # owner/superuser URL; absent -> embedded PostgreSQL in data_dir
    runtime_database_url: str | None = None  # the runtime role's URL; absent -> derived from database_url
    reader_database_url: str | None = None  # the diagnostics reader's URL; absent -> derived
    data_dir: str = ".effect-ledger"  # embedded PostgreSQL data and the development JWT secret
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1  # serve processes; each has its own pools
    http_server: str = "uvicorn"  # the ASGI server `serve` runs: uvicorn or granian
    jwt_secret: str | None = None  # HS256 shared secret
    jwt_public_key_file: str | None = None  # PEM public key or JWKS file for RS256/ES256/EdDSA
    jwt_algorithm: str = "HS256"
    jwt_audience: str = "effect-ledger"
    jwt_issuer: str = "effect-ledger"
    retention_days: int = 30  # terminal operations and their events are purged after this
    diagnostics_retention_days: int = 14
    access_log_retention_days: int = 365
    pool_size: int = 10  # runtime connections per worker
    reader_pool_size: int = 2  # diagnostics reader connections per worker
    pool_acquire_timeout_ms: int = 2000  # waiting longer for a connection answers 503
    statement_timeout_ms: int = 5000
    lock_timeout_ms: int = 2000
    idle_in_transaction_timeout_ms: int = 10000
    max_body_bytes: int = 256 * 1024
    background_sweep: bool = True  # run sweep and purge inside serve (off when CronJobs do them)
    sweep_interval_seconds: int = 5
    sweep_batch_size: int = 100  # operations locked and swept per transaction
    purge_interval_seconds: int = 3600  # how often serve's background purge runs
    purge_batch_size: int = 500  # operations (with their events) deleted per transaction
    log_level: str = "info"
    shutdown_timeout_seconds: int = 20

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read EFFECT_LEDGER_* variables, then apply explicit overrides (CLI flags) that are not None."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _coerce(f.name, raw, cls.__dataclass_fields__[f.name].default)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def data_path(self) -> Path:
        """The data directory as an absolute path."""
        return Path(self.data_dir).expanduser().resolve()

    def with_database(self, url: str) -> Settings:
        """A copy pointing at a database (used once the embedded server is up)."""
        return replace(self, database_url=url)


def _coerce(name: str, raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise SystemExit(f"{PREFIX}{name.upper()} must be true or false")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise SystemExit(f"{PREFIX}{name.upper()} must be an integer") from None
    return raw
