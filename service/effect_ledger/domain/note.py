"""c2sp.org/signed-note (Ed25519), c2sp.org/tlog-checkpoint and c2sp.org/tlog-cosignature (Ed25519,
cosignature/v1): formats, key IDs, signing and verification (no I/O; keys are passed in).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALG_ED25519 = 0x01
ALG_COSIGNATURE_V1 = 0x04
EM_DASH = "\u2014"
MAX_SIGNATURES = 64


class NoteError(ValueError):
    """A note, key or checkpoint that does not parse or verify; the message is the reason."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise NoteError("not base64") from exc


def _check_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise NoteError("key name empty or with a space or plus")


def key_id(name: str, alg: int, public: bytes) -> bytes:
    """SHA-256(name || 0x0A || alg || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public).digest()[:4]


@dataclass(frozen=True, slots=True)
class Verifier:
    """A parsed vkey: name, key ID, signature type and the Ed25519 public key."""

    name: str
    key_id: bytes
    alg: int
    public: bytes

    @property
    def vkey(self) -> str:
        return f"{self.name}+{self.key_id.hex()}+{b64(bytes([self.alg]) + self.public)}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


def parse_vkey(vkey: str) -> Verifier:
    """`name+hex(keyid)+base64(alg || pubkey)` for Ed25519 (0x01) or cosignature/v1 (0x04) keys."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3:
        raise NoteError("a vkey has three parts separated by +")
    name, id_hex, material = parts
    _check_name(name)
    raw = unb64(material)
    if len(id_hex) != 8 or len(raw) != 33 or raw[0] not in (ALG_ED25519, ALG_COSIGNATURE_V1):
        raise NoteError("not an Ed25519 vkey")
    try:
        kid = bytes.fromhex(id_hex)
    except ValueError as exc:
        raise NoteError("key ID not hex") from exc
    if kid != key_id(name, raw[0], raw[1:]):
        raise NoteError("key ID does not match the key")
    return Verifier(name, kid, raw[0], raw[1:])


@dataclass(frozen=True, slots=True)
class Signer:
    """An Ed25519 note signer (alg 0x01) or cosigner (0x04) from a 32-byte seed."""

    name: str
    seed: bytes
    alg: int = ALG_ED25519

    def __post_init__(self) -> None:
        _check_name(self.name)
        if len(self.seed) != 32:
            raise NoteError("an Ed25519 seed is 32 bytes")

    @property
    def public(self) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.seed).public_key().public_bytes_raw()

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, key_id(self.name, self.alg, self.public), self.alg, self.public)

    def raw_sign(self, message: bytes) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self.seed).sign(message)


@dataclass(frozen=True, slots=True)
class Signature:
    """One signature line: key name, key ID and the signature bytes after the ID."""

    name: str
    key_id: bytes
    sig: bytes

    @property
    def line(self) -> str:
        return f"{EM_DASH} {self.name} {b64(self.key_id + self.sig)}\n"


@dataclass(frozen=True, slots=True)
class Note:
    """A signed note split into its text (ending in a newline) and its signature lines."""

    text: str
    signatures: tuple[Signature, ...]

    def render(self) -> str:
        return self.text + "\n" + "".join(s.line for s in self.signatures)


def parse_note(data: str) -> Note:
    """Split a signed note at its last blank line; every line after it must be a signature line."""
    if any(ord(c) < 0x20 and c != "\n" for c in data):
        raise NoteError("control character in note")
    if not data.endswith("\n"):
        raise NoteError("note does not end in a newline")
    cut = data.rfind("\n\n")
    if cut < 0:
        raise NoteError("note has no signature block")
    text, block = data[: cut + 1], data[cut + 2 :]
    signatures: list[Signature] = []
    for line in block.splitlines():
        if not line.startswith(EM_DASH + " "):
            raise NoteError("malformed signature line")
        fields = line[2:].split(" ")
        if len(fields) != 2:
            raise NoteError("malformed signature line")
        name, value = fields
        _check_name(name)
        raw = unb64(value)
        if len(raw) < 5:
            raise NoteError("signature too short")
        signatures.append(Signature(name, raw[:4], raw[4:]))
    if not signatures:
        raise NoteError("note has no signature")
    if len(signatures) > MAX_SIGNATURES:
        raise NoteError("too many signatures")
    return Note(text, tuple(signatures))


def sign_note(text: str, signer: Signer) -> str:
    """The signed note of `text` (which must end in a newline) with one Ed25519 signature."""
    if not text.endswith("\n"):
        raise NoteError("note text must end in a newline")
    sig = Signature(signer.name, signer.verifier.key_id, signer.raw_sign(text.encode()))
    return Note(text, (sig,)).render()


def note_signed_by(note: Note, verifier: Verifier) -> bool:
    """Whether the note carries a signature of this key (matched by name and ID) that verifies; a
    matching signature that fails makes the answer False even if another one verifies."""
    found = False
    for sig in note.signatures:
        if sig.name == verifier.name and sig.key_id == verifier.key_id:
            if verifier.alg == ALG_ED25519:
                ok = verifier.verify(note.text.encode(), sig.sig)
            else:
                ok = _cosignature_ok(note.text, verifier, sig)
            if not ok:
                return False
            found = True
    return found


# ---- checkpoints -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The body of a c2sp.org/tlog-checkpoint: origin, tree size, root hash (no extension lines)."""

    origin: str
    size: int
    root: bytes

    @property
    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{b64(self.root)}\n"


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint a note's text holds; extension lines are allowed and ignored."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
        raise NoteError("a checkpoint has at least three non-empty lines")
    origin, size_text, root_text = lines[0], lines[1], lines[2]
    if not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")) or not size_text.isascii():
        raise NoteError("tree size not a decimal without leading zeroes")
    root = unb64(root_text)
    if len(root) != 32:
        raise NoteError("root hash not 32 bytes")
    return Checkpoint(origin, int(size_text), root)


# ---- cosignatures (c2sp.org/tlog-cosignature, Ed25519 cosignature/v1) ---------------------------


def cosigned_message(checkpoint_text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n{checkpoint_text}".encode()


def cosign(checkpoint_text: str, cosigner: Signer, timestamp: int) -> Signature:
    """A witness's cosignature/v1 line over a checkpoint body: key ID || u64 time || Ed25519 sig."""
    if cosigner.alg != ALG_COSIGNATURE_V1:
        raise NoteError("a cosigner key has signature type 0x04")
    sig = cosigner.raw_sign(cosigned_message(checkpoint_text, timestamp))
    return Signature(cosigner.name, cosigner.verifier.key_id, timestamp.to_bytes(8, "big") + sig)


def _cosignature_ok(text: str, verifier: Verifier, sig: Signature) -> bool:
    if len(sig.sig) != 72:
        return False
    timestamp = int.from_bytes(sig.sig[:8], "big")
    if timestamp >= 1 << 63:
        return False
    return verifier.verify(cosigned_message(text, timestamp), sig.sig[8:])


# ---- signer keys (golang.org/x/mod/sumdb/note's format) ----------------------------------------


def format_skey(signer: Signer) -> str:
    """`PRIVATE+KEY+name+hex(keyid)+base64(alg || seed)`, as Go's note.GenerateKey writes it."""
    return (
        f"PRIVATE+KEY+{signer.name}+{signer.verifier.key_id.hex()}+{b64(bytes([signer.alg]) + signer.seed)}"
    )


def parse_skey(skey: str) -> Signer:
    """A signer key in Go's note format (Ed25519 0x01, or a 0x04 cosigner key); checks its key ID."""
    parts = skey.strip().split("+", 4)
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
        raise NoteError("not a PRIVATE+KEY+name+id+key signer key")
    name, id_hex, material = parts[2:]
    _check_name(name)
    raw = unb64(material)
    if len(raw) != 33 or raw[0] not in (ALG_ED25519, ALG_COSIGNATURE_V1):
        raise NoteError("not an Ed25519 signer key")
    signer = Signer(name, raw[1:], raw[0])
    if signer.verifier.key_id.hex() != id_hex:
        raise NoteError("signer key ID does not match the key")
    return signer
