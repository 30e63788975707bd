"""The log signer (API.md section 14): holds the Ed25519 key, outside the database, and its own state
(the last size and root it signed per origin) in a file, outside the database too. It signs a new
checkpoint only with a valid consistency proof from that state, so a rewrite of logged history in
the database never gets a signature.

`LocalSigner` runs in the service's process (the embedded mode); `effect-ledger log-signer` serves
the same over HTTP on a local address (`serve_signer`) and `RemoteSigner` is the service's client.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, parse_qsl, urlsplit

from effect_ledger.domain.merkle import verify_consistency
from effect_ledger.domain.note import (
    Checkpoint,
    NoteError,
    Signer,
    b64,
    format_skey,
    parse_skey,
    sign_note,
    unb64,
)
from effect_ledger.durable import replace_json
from effect_ledger.settings import Settings, read_token

STATE_FILE = "state.json"


class SignRefused(Exception):
    """The signer refused to sign; `reason` is a stable word (a metric label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Signed:
    """What the signer last signed for an origin."""

    size: int
    root: bytes


class LogSigner(Protocol):
    """What the checkpointer needs of a signer, local or remote."""

    async def states(self) -> dict[str, Signed]: ...

    async def vkey(self, origin: str) -> str: ...

    async def sign(self, origin: str, size: int, root: bytes, proof: Sequence[bytes]) -> str: ...

    async def accept_loss(self, origin: str, size: int, root: bytes) -> None: ...


def create_key(path: Path, prefix: str) -> None:
    """Write a new signer key file (mode 0600) unless one exists; atomic, so processes starting at
    once agree on one key (each writes a private temporary file, the first link wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(format_skey(Signer(prefix, secrets.token_bytes(32))) + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process created it first: use that one
    finally:
        tmp.unlink(missing_ok=True)


class FileSigner:
    """The signing rule over a key file and a state directory (synchronous; one file lock)."""

    def __init__(self, key_path: Path, state_dir: Path) -> None:
        self._key = parse_skey(key_path.read_text())
        self.prefix = self._key.name
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)

    def signer_for(self, origin: str) -> Signer:
        if not origin.startswith(self.prefix + "/") or len(origin) == len(self.prefix) + 1:
            raise SignRefused("foreign_origin", "this signer signs only origins under its prefix")
        return Signer(origin, self._key.seed)

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.state_dir / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                path = self.state_dir / STATE_FILE
                state = json.loads(path.read_text()) if path.exists() else {}
                yield state
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, state: dict[str, Any]) -> None:
        replace_json(self.state_dir / STATE_FILE, state)

    def states(self) -> dict[str, Signed]:
        with self._locked() as state:
            return {o: Signed(v["size"], unb64(v["root"])) for o, v in state.items()}

    def vkey(self, origin: str) -> str:
        return self.signer_for(origin).verifier.vkey

    def sign(self, origin: str, size: int, root: bytes, proof: Sequence[bytes]) -> str:
        signer = self.signer_for(origin)
        with self._locked() as state:
            last = state.get(origin)
            old = Signed(last["size"], unb64(last["root"])) if last else Signed(0, b"")
            if size < old.size:
                raise SignRefused("log_behind_signer", f"size {size} is below the signed size {old.size}")
            if not verify_consistency(old.size, size, old.root, root, proof):
                raise SignRefused(
                    "inconsistent", f"no valid consistency proof from size {old.size} to {size}"
                )
            note = sign_note(Checkpoint(origin, size, root).text, signer)
            state[origin] = {"size": size, "root": b64(root)}
            self._write(state)  # durable before the signature leaves the signer
            return note

    def accept_loss(self, origin: str, size: int, root: bytes) -> None:
        """An operator's decision: the log of `origin` continues from (size, root), below what was signed."""
        self.signer_for(origin)
        with self._locked() as state:
            history = state.get(origin, {}).get("accepted_losses", [])
            last = state.get(origin)
            if last:
                history = [*history, {"size": last["size"], "root": last["root"]}]
            state[origin] = {"size": size, "root": b64(root), "accepted_losses": history}
            self._write(state)


class LocalSigner:
    """The in-process signer of the embedded mode (file work off the event loop)."""

    def __init__(self, inner: FileSigner) -> None:
        self.inner = inner

    async def states(self) -> dict[str, Signed]:
        return await asyncio.to_thread(self.inner.states)

    async def vkey(self, origin: str) -> str:
        return self.inner.vkey(origin)

    async def sign(self, origin: str, size: int, root: bytes, proof: Sequence[bytes]) -> str:
        return await asyncio.to_thread(self.inner.sign, origin, size, root, proof)

    async def accept_loss(self, origin: str, size: int, root: bytes) -> None:
        await asyncio.to_thread(self.inner.accept_loss, origin, size, root)


class RemoteSigner:
    """The service's client of an `effect-ledger log-signer` process (with the shared token, when
    configured, as a bearer token on every request)."""

    def __init__(self, url: str, timeout: float = 5.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx  # only a service with a remote signer: not in every serve process's start

        async with httpx.AsyncClient(timeout=self.timeout, headers=self._headers) as client:
            response = await client.request(method, self.url + path, **kwargs)
        if response.status_code == 401:
            raise SignRefused(
                "unauthorized", "the log signer refused this service's token (LOG_SIGNER_TOKEN_FILE)"
            )
        if response.status_code == 409:
            body = response.json()
            raise SignRefused(str(body.get("reason")), str(body.get("detail")))
        response.raise_for_status()
        return response.json()

    async def states(self) -> dict[str, Signed]:
        body = await self._call("GET", "/v1/state")
        return {o: Signed(v["size"], unb64(v["root"])) for o, v in body.items()}

    async def vkey(self, origin: str) -> str:
        return str((await self._call("GET", "/v1/key", params={"origin": origin}))["vkey"])

    async def sign(self, origin: str, size: int, root: bytes, proof: Sequence[bytes]) -> str:
        body = {"origin": origin, "size": size, "root": b64(root), "proof": [b64(p) for p in proof]}
        return str((await self._call("POST", "/v1/sign", json=body))["note"])

    async def accept_loss(self, origin: str, size: int, root: bytes) -> None:
        raise SignRefused(
            "remote_signer", "accept a loss on the signer's host: effect-ledger log-signer --accept-loss"
        )


def serve_signer(signer: FileSigner, host: str, port: int, token: str | None = None) -> ThreadingHTTPServer:
    """The signer's HTTP interface: GET /v1/state, GET /v1/key?origin=, POST /v1/sign {origin, size,
    root, proof}. A refusal is 409 {reason, detail}. With `token`, every request must carry it as a
    bearer token (else 401 {reason: unauthorized}, compared in constant time); without one, only a
    loopback `host` is allowed (ValueError)."""
    if token is None and not _loopback(host):
        raise ValueError(f"listening on {host} needs a token (LOG_SIGNER_TOKEN_FILE / --token-file)")
    expected = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        def _authorized(self) -> bool:
            if expected is None:
                return True
            given = (self.headers.get("Authorization") or "").encode("latin-1", "replace")
            if hmac.compare_digest(given, expected):
                return True
            self._send(401, {"reason": "unauthorized"})
            return False

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            if not self._authorized():
                return
            url = urlsplit(self.path)
            try:
                if url.path == "/v1/state":
                    states = signer.states()
                    self._send(200, {o: {"size": s.size, "root": b64(s.root)} for o, s in states.items()})
                elif url.path == "/v1/key":
                    origin = parse_qs(url.query).get("origin", [""])[0]
                    self._send(200, {"origin": origin, "vkey": signer.vkey(origin)})
                else:
                    self._send(404, {"reason": "not_found"})
            except SignRefused as refused:
                self._send(409, {"reason": refused.reason, "detail": refused.detail})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if urlsplit(self.path).path != "/v1/sign":
                self._send(404, {"reason": "not_found"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                if length > 1 << 20:
                    raise ValueError("too large")
                body = json.loads(self.rfile.read(length))
                proof = [unb64(p) for p in body["proof"]]
                note = signer.sign(str(body["origin"]), int(body["size"]), unb64(body["root"]), proof)
                self._send(200, {"note": note})
            except SignRefused as refused:
                self._send(409, {"reason": refused.reason, "detail": refused.detail})
            except (ValueError, KeyError, TypeError, NoteError):
                self._send(400, {"reason": "malformed"})

    return ThreadingHTTPServer((host, port), Handler)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def key_path(settings: Settings) -> Path:
    """The in-process signer's key file: LOG_SIGNER_KEY, or DATA_DIR/log-signer/key."""
    return (
        Path(settings.log_signer_key).expanduser()
        if settings.log_signer_key
        else settings.data_path / "log-signer" / "key"
    )


def state_path(settings: Settings) -> Path:
    """The in-process signer's state directory: LOG_SIGNER_STATE, or one per database under
    DATA_DIR/log-signer (named by a digest of the database's host, port and name, never its
    credentials): a data directory shared by services of different databases never mixes their
    states. A restore into a database of another name is caught only with LOG_SIGNER_STATE set
    (or a signer of its own): set it in production."""
    if settings.log_signer_state:
        return Path(settings.log_signer_state).expanduser()
    where = urlsplit(settings.database_url or "")
    hosts = where.netloc.rpartition("@")[2]  # host:port, or several of them (a failover URL)
    # a socket directory (the embedded server's `?host=/tmp/…`) or port in the query names the server too
    located = [f"{k}={v}" for k, v in parse_qsl(where.query) if k in ("host", "port", "hostaddr")]
    identity = f"{hosts}{where.path}{'?' + '&'.join(located) if located else ''}".encode()
    return settings.data_path / "log-signer" / f"state-{hashlib.sha256(identity).hexdigest()[:16]}"


def signer_from_settings(settings: Settings) -> LogSigner:
    """A remote signer at LOG_SIGNER_URL, or the in-process one (its key created in DATA_DIR on first
    use when no LOG_SIGNER_KEY is configured: the embedded mode)."""
    if settings.log_signer_url:
        token = read_token(settings.log_signer_token_file) if settings.log_signer_token_file else None
        return RemoteSigner(settings.log_signer_url, token=token)
    path = key_path(settings)
    if not settings.log_signer_key:
        create_key(path, settings.log_origin)
    return LocalSigner(FileSigner(path, state_path(settings)))
