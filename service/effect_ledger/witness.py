"""`effect-ledger witness`: a complete small c2sp.org/tlog-witness (add-checkpoint) with persisted state.

State: DIR/state.json, {origin: {size, root}}, rewritten atomically and durably (durable.replace_json:
the file's fsync, the rename, the directory's fsync) under a file lock held across the check and the
write, so two requests can never roll the record back (the race the spec describes). The cosigner
key is a Go-format `PRIVATE+KEY+name+id+…` file of signature type 0x04 (created on first start when
absent; its vkey is printed).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from effect_ledger.domain.note import (
    ALG_COSIGNATURE_V1,
    Signer,
    Verifier,
    b64,
    format_skey,
    parse_skey,
    parse_vkey,
    unb64,
)
from effect_ledger.domain.witness import decide
from effect_ledger.durable import replace_json

MAX_BODY = 64 * 1024


def load_or_create_key(path: Path, name: str) -> Signer:
    """The witness's cosigner key from its file, created (mode 0600) when absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(format_skey(Signer(name, secrets.token_bytes(32), ALG_COSIGNATURE_V1)) + "\n")
    signer = parse_skey(path.read_text())
    return Signer(signer.name, signer.seed, ALG_COSIGNATURE_V1)


class WitnessState:
    """The witness's record per origin, in a file, checked and updated under one lock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "state.json"

    def add_checkpoint(
        self, body: bytes, logs: dict[str, Verifier], cosigner: Signer
    ) -> tuple[int, str, str]:
        with open(self.directory / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                raw = json.loads(self.path.read_text()) if self.path.exists() else {}
                records = {o: (v["size"], unb64(v["root"])) for o, v in raw.items()}
                answer = decide(body, logs, records, cosigner, int(time.time()))
                if answer.record is not None:
                    origin, size, root = answer.record
                    raw[origin] = {"size": size, "root": b64(root)}
                    replace_json(self.path, raw)  # durable (the directory too) before the cosignature leaves
                return answer.status, answer.body, answer.content_type
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def make_witness(
    state_dir: Path, key: Signer, log_vkeys: Sequence[str], host: str, port: int
) -> ThreadingHTTPServer:
    """The witness's HTTP server: POST /add-checkpoint (bind it where the log can reach it)."""
    logs = {v.name: v for v in (parse_vkey(k) for k in log_vkeys)}
    state = WitnessState(state_dir)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: str, content_type: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if urlsplit(self.path).path.rstrip("/").split("/")[-1] != "add-checkpoint":
                self._send(404, "not found\n", "text/plain; charset=utf-8")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._send(400, "request too large\n", "text/plain; charset=utf-8")
                return
            self._send(*state.add_checkpoint(self.rfile.read(length), logs, key))

    return ThreadingHTTPServer((host, port), Handler)
