"""What the receipts log's tests share: a service's settings with the log on and quick, and one of
our own commands (`effect-ledger log-signer`, `effect-ledger witness`) run for the length of a block."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from effect_ledger.settings import Settings

CLI = Path(sys.executable).with_name("effect-ledger")


def log_settings(settings: Settings, tmp_path: Path, **more: object) -> Settings:
    """The log on, its signer in process with its state under tmp_path, a checkpoint every second and
    an integration pass every 50 ms. The rate limit is off: these tests commit hundreds of operations of
    one principal back to back (on a fast machine 600 requests outran burst 400, 200/s; the limit has
    its own tests, test_rate_limits.py)."""
    return replace(
        settings,
        log_enabled=True,
        log_signer_key=None,
        log_signer_state=str(tmp_path / "signer"),
        data_dir=str(tmp_path / "data"),
        log_checkpoint_seconds=1,
        log_integrate_interval_ms=50,
        rate_limit_per_second=0,
        **more,  # type: ignore[arg-type]
    )


@contextmanager
def cli_process(*args: str, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`effect-ledger ARGS…` until the block ends; yields the JSON of its first line (where it listens)."""
    proc = subprocess.Popen(
        [str(CLI), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        yield json.loads(line)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # waits, and closes both pipes
