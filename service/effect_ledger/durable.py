"""State files that must survive a crash (the log signer's and the witness's: API.md section 14)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def replace_json(path: Path, value: Any) -> None:
    """Replace `path` with `value` as JSON, durably: written to a temporary file beside it and fsynced,
    renamed over it, and its directory fsynced, so that after a crash the file holds the old value or
    the new one, and the new one once this returns (the rename is an entry of the directory, and
    without the directory's fsync it may be lost with the machine even though the data was written).
    A signer or a witness that forgot its last record could sign or cosign a rewrite of history."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as out:
        json.dump(value, out, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
