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
from typing import Any

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


def purge_beside_the_next_check(monkeypatch: Any, settings: Settings, purged: int) -> None:
    """The next integration pass checks its batch only after a purge (which must purge `purged`
    operations) ran: after log_batch read the rows and their heads, before an operation whose head was
    not the usual one is read again with its chain (_judged_again)."""
    from effect_ledger.db import receipt_log
    from effect_ledger.db.maintenance import purge

    checked = receipt_log._intact_receipts

    async def purged_meanwhile(*args: Any) -> Any:
        monkeypatch.setattr(receipt_log, "_intact_receipts", checked)  # the first pass only
        assert (await purge(settings)).counts["operations"] == purged
        return await checked(*args)

    monkeypatch.setattr(receipt_log, "_intact_receipts", purged_meanwhile)


async def integrate_twice(conn: Any) -> tuple[int | None, int | None, list[str]]:
    """Two integration passes of t1 (batches of 50): what each appended, and the refusals counted."""
    from effect_ledger.db import receipt_log

    refused: list[str] = []
    first = await receipt_log.integrate_tenant(conn, "t1", 50, lambda reason, _: refused.append(reason))
    second = await receipt_log.integrate_tenant(conn, "t1", 50, lambda reason, _: refused.append(reason))
    return first, second, refused


async def commit_with_a_discrepancy(settings: Settings) -> None:
    """With the log off: op-0 committed; op-1 committed, then a retried complete with another receipt,
    answered 409 conflicting_outcome, which appends a `discrepancy` event (committed -> committed) after
    the receipt's `completed` event; op-2 committed."""
    from support.ledger import CLAIM, RECEIPT, call, claim, committed
    from support.server import Service

    async with Service(settings) as off, off.client() as client:
        await committed(client, "op-0")
        token = (await claim(client, "op-1", {**CLAIM})).json()["claim"]["token"]
        done = {"token": token, "outcome": "committed", "receipt": RECEIPT}
        assert (await call(client, "op-1", "complete", done)).status_code == 200
        other = {**done, "receipt": {**RECEIPT, "external_ref": "another"}}
        r = await call(client, "op-1", "complete", other)
        assert (r.status_code, r.json()["code"]) == (409, "conflicting_outcome"), r.text
        await committed(client, "op-2")
