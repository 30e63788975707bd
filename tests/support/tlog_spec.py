"""An auditor's verifier of a tiled transparency log, written from the specifications alone.

It imports nothing of effect_ledger (not the domain's merkle, tiles, note or receipt_log modules, not
the client's verify), so a misreading shared by our service and our own verifier cannot hide here:

- RFC 6962 section 2.1: leaf hash SHA-256(0x00 || d), node hash SHA-256(0x01 || l || r), MTH with the
  split at the largest power of two below n; PATH (2.1.1) and PROOF (2.1.2) as the tests' reference;
- RFC 9162 sections 2.1.3.2 and 2.1.4.2: verifying an inclusion and a consistency proof, step by step;
- c2sp.org/signed-note (Ed25519, type 0x01; key ID = SHA-256(name || 0x0A || type || key)[:4]; vkeys
  `name+hex(ID)+base64(type || key)`), c2sp.org/tlog-checkpoint, c2sp.org/tlog-cosignature (type 0x04,
  `cosignature/v1\\ntime T\\n` + checkpoint body), c2sp.org/tlog-tiles (paths, widths, entry bundles)
  and c2sp.org/tlog-proof@v1 (the proof file).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
TILE_WIDTH = 256
PROOF_HEADER = "c2sp.org/tlog-proof@v1"
DECIMAL = re.compile(r"0|[1-9][0-9]*")


class Rejected(Exception):
    """The verifier refuses what it was given; the message says why."""


# RFC 6962 section 2.1


def leaf_hash(data: bytes) -> bytes:
    """MTH({d}) = SHA-256(0x00 || d)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def split(n: int) -> int:
    """k, the largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def mth(leaves: list[bytes]) -> bytes:
    """The Merkle Tree Hash of a list of leaf hashes."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = split(len(leaves))
    return node_hash(mth(leaves[:k]), mth(leaves[k:]))


def path(m: int, leaves: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]): the audit path of leaf m (RFC 6962 2.1.1), the reference for self-checks."""
    if len(leaves) <= 1:
        return []
    k = split(len(leaves))
    if m < k:
        return [*path(m, leaves[:k]), mth(leaves[k:])]
    return [*path(m - k, leaves[k:]), mth(leaves[:k])]


def proof(m: int, leaves: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) = SUBPROOF(m, D[n], true) (RFC 6962 2.1.2), the reference for self-checks."""

    def subproof(m: int, part: list[bytes], whole: bool) -> list[bytes]:
        if m == len(part):
            return [] if whole else [mth(part)]
        k = split(len(part))
        if m <= k:
            return [*subproof(m, part[:k], whole), mth(part[k:])]
        return [*subproof(m - k, part[k:], False), mth(part[:k])]

    return subproof(m, leaves, True)


# RFC 9162 section 2.1.3.2 and 2.1.4.2


def verify_inclusion(index: int, size: int, leaf: bytes, inclusion_path: list[bytes], root: bytes) -> bool:
    """Does `inclusion_path` bind the leaf hash at `index` to `root`, the tree of `size` leaves?"""
    if index >= size:  # 1.
        return False
    fn, sn = index, size - 1  # 2.
    r = leaf  # 3.
    for p in inclusion_path:  # 4.
        if sn == 0:  # a.
            return False
        if fn & 1 or fn == sn:  # b.
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1  # c.
    return sn == 0 and r == root  # 5.


def verify_consistency(
    first: int, second: int, first_hash: bytes, second_hash: bytes, c: list[bytes]
) -> bool:
    """Does the consistency path `c` prove the tree (first, first_hash) a prefix of (second, second_hash)?

    The algorithm's own precondition is 0 < first < second; equal sizes prove with an empty path.
    """
    if first == second:
        return not c and first_hash == second_hash
    if not 0 < first < second or not c:  # 1.
        return False
    path_ = [first_hash, *c] if first & (first - 1) == 0 else list(c)  # 2.
    fn, sn = first - 1, second - 1  # 3.
    while fn & 1:  # 4.
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path_[0]  # 5.
    for value in path_[1:]:  # 6.
        if sn == 0:  # a.
            return False
        if fn & 1 or fn == sn:  # b.
            fr, sr = node_hash(value, fr), node_hash(value, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, value)
        fn, sn = fn >> 1, sn >> 1  # c.
    return fr == first_hash and sr == second_hash and sn == 0  # 7.


# c2sp.org/signed-note, tlog-checkpoint, tlog-cosignature


def b64decode(text: str) -> bytes:
    """Standard base64 (RFC 4648 section 4), padding and alphabet checked."""
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise Rejected(f"not base64: {text!r}") from exc


def key_id(name: str, sig_type: int, public_key: bytes) -> bytes:
    """SHA-256(key name || 0x0A || signature type || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public_key).digest()[:4]


@dataclass(frozen=True)
class VerifierKey:
    """A parsed vkey: `name+hex(key ID)+base64(type || public key)`."""

    name: str
    key_id: bytes
    sig_type: int
    public_key: bytes


def parse_vkey(vkey: str, sig_type: int = ED25519) -> VerifierKey:
    """A vkey of an Ed25519 key (type 0x01, or 0x04 for a cosigner), its ID checked against its key."""
    parts = vkey.split("+", 2)  # the name has no "+", the base64 may
    if len(parts) != 3 or not parts[0] or not re.fullmatch(r"[0-9a-f]{8}", parts[1]):
        raise Rejected(f"not a vkey: {vkey!r}")
    name, hex_id, material = parts[0], bytes.fromhex(parts[1]), b64decode(parts[2])
    if len(material) != 33 or material[0] != sig_type:
        raise Rejected(f"vkey of type {material[:1].hex()} and {len(material) - 1} key bytes")
    if key_id(name, sig_type, material[1:]) != hex_id:
        raise Rejected("the vkey's key ID is not the hash of its name and key")
    return VerifierKey(name, hex_id, sig_type, material[1:])


@dataclass(frozen=True)
class Note:
    """A signed note: its text (with the final newline) and its signature lines as (name, bytes)."""

    text: str
    signatures: list[tuple[str, bytes]]


def parse_note(note: str) -> Note:
    """Split a signed note at its last blank line; every signature line is `— name base64`."""
    if any(ord(ch) < 0x20 and ch != "\n" for ch in note):
        raise Rejected("a control character other than newline")
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise Rejected("no blank line before the signatures, or no final newline")
    signatures = []
    for line in note[cut + 2 :].removesuffix("\n").split("\n"):
        m = re.fullmatch(r"\u2014 (\S+) (\S+)", line)
        if m is None:
            raise Rejected(f"not a signature line: {line!r}")
        blob = b64decode(m.group(2))
        if len(blob) < 5:
            raise Rejected("a signature shorter than its key ID")
        signatures.append((m.group(1), blob))
    return Note(note[: cut + 1], signatures)


def _ed25519(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except InvalidSignature:
        return False
    return True


def verify_note(note: str, key: VerifierKey) -> Note:
    """The note, if `key` signed it (type 0x01); a known key's bad signature rejects the whole note."""
    parsed = parse_note(note)
    known = [blob for name, blob in parsed.signatures if name == key.name and blob[:4] == key.key_id]
    if not known:
        raise Rejected(f"no signature by {key.name}")
    for blob in known:
        if len(blob) != 4 + 64 or not _ed25519(key.public_key, blob[4:], parsed.text.encode()):
            raise Rejected(f"a bad signature by {key.name}")
    return parsed


def verify_cosignature(note: Note, key: VerifierKey, now: int) -> int:
    """The timestamp of `key`'s valid tlog-cosignature/v1 on the checkpoint note (type 0x04)."""
    known = [blob for name, blob in note.signatures if name == key.name and blob[:4] == key.key_id]
    if len(known) != 1 or len(known[0]) != 4 + 8 + 64:
        raise Rejected(f"{len(known)} cosignatures by {key.name}, or one of the wrong length")
    timestamp = int.from_bytes(known[0][4:12], "big")
    message = f"cosignature/v1\ntime {timestamp}\n".encode() + note.text.encode()
    if timestamp >= 1 << 63 or timestamp > now + 60:
        raise Rejected(f"cosignature timestamp {timestamp} in the future")
    if not _ed25519(key.public_key, known[0][12:], message):
        raise Rejected(f"a bad cosignature by {key.name}")
    return timestamp


@dataclass(frozen=True)
class Checkpoint:
    """The note text of a checkpoint: origin, tree size, root hash, extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: list[str]


def parse_checkpoint(text: str) -> Checkpoint:
    """Origin, a decimal size with no leading zeroes, a base64 SHA-256 root, non-empty extensions."""
    lines = text.removesuffix("\n").split("\n")
    if len(lines) < 3 or not lines[0] or not DECIMAL.fullmatch(lines[1]) or not all(lines[3:]):
        raise Rejected(f"not a checkpoint: {text!r}")
    root = b64decode(lines[2])
    if len(root) != 32:
        raise Rejected("a root hash that is not 32 bytes")
    return Checkpoint(lines[0], int(lines[1]), root, lines[3:])


def verified_checkpoint(note: str, key: VerifierKey, origin: str) -> tuple[Checkpoint, Note]:
    """A checkpoint signed by the log's key, of the expected origin."""
    parsed = verify_note(note, key)
    checkpoint = parse_checkpoint(parsed.text)
    if checkpoint.origin != origin:
        raise Rejected(f"origin {checkpoint.origin!r}, expected {origin!r}")
    return checkpoint, parsed


# c2sp.org/tlog-tiles


def tile_index(n: int) -> str:
    """N as zero-padded 3-digit path elements, all but the last prefixed with `x` (1234067: x001/x234/067)."""
    groups = [f"{n % 1000:03d}"]
    while n >= 1000:
        n //= 1000
        groups.append(f"x{n % 1000:03d}")
    return "/".join(reversed(groups))


def tile_path(level: int | str, n: int, width: int = TILE_WIDTH) -> str:
    """`tile/L/N[.p/W]` (level "entries" for entry bundles); W only for a partial tile."""
    return f"tile/{level}/{tile_index(n)}" + ("" if width == TILE_WIDTH else f".p/{width}")


def tiles_of(size: int) -> list[tuple[int, int, int]]:
    """(level, index, width) of every tile of a tree of `size` leaves: full ones and the partial ones."""
    out = []
    level = 0
    while size // TILE_WIDTH**level:
        hashes = size // TILE_WIDTH**level
        out += [(level, n, TILE_WIDTH) for n in range(hashes // TILE_WIDTH)]
        if hashes % TILE_WIDTH:
            out.append((level, hashes // TILE_WIDTH, hashes % TILE_WIDTH))
        level += 1
    return out


def decode_bundle(blob: bytes) -> list[bytes]:
    """An entry bundle: entries each prefixed with its length, a big-endian uint16."""
    entries, at = [], 0
    while at < len(blob):
        if at + 2 > len(blob):
            raise Rejected("a truncated length prefix")
        length = int.from_bytes(blob[at : at + 2], "big")
        if at + 2 + length > len(blob):
            raise Rejected("a truncated entry")
        entries.append(blob[at + 2 : at + 2 + length])
        at += 2 + length
    return entries


def root_from_tiles(size: int, hash_at: Callable[[int, int], bytes]) -> bytes:
    """The root of `size` leaves from tile hashes: `hash_at(level, i)` is MTH of leaves i*256**L ...

    The tree is the right fold of its complete subtrees, largest first (MTH splits at the largest power
    of two); a subtree of 2**k leaves is MTH of 2**(k % 8) consecutive hashes of a level k // 8 tile.
    """
    subtrees, start = [], 0
    for k in reversed(range(size.bit_length())):
        if size >> k & 1:
            level, count = divmod(k, 8)
            first = start // TILE_WIDTH**level
            subtrees.append(mth([hash_at(level, first + j) for j in range(1 << count)]))
            start += 1 << k
    root = subtrees[-1]
    for left in reversed(subtrees[:-1]):
        root = node_hash(left, root)
    return root


# c2sp.org/tlog-proof@v1


@dataclass(frozen=True)
class ProofFile:
    """A tlog-proof file: extra data, index, inclusion path, and the checkpoint note verbatim."""

    extra: bytes | None
    index: int
    inclusion_path: list[bytes]
    checkpoint: str


def parse_proof(text: str) -> ProofFile:
    """The header line, an optional `extra` line, `index N`, hashes, an empty line, the checkpoint."""
    lines = text.split("\n")
    if lines[0] != PROOF_HEADER:
        raise Rejected(f"header {lines[0]!r}")
    at, extra = 1, None
    if lines[at].startswith("extra "):
        extra, at = b64decode(lines[at][len("extra ") :]), at + 1
    index = lines[at].removeprefix("index ")
    if not lines[at].startswith("index ") or not DECIMAL.fullmatch(index):
        raise Rejected(f"index line {lines[at]!r}")
    at += 1
    hashes = []
    while at < len(lines) and lines[at]:
        hashes.append(b64decode(lines[at]))
        at += 1
    if at >= len(lines) or any(len(h) != 32 for h in hashes):
        raise Rejected("no empty line after the inclusion proof, or a hash not of 32 bytes")
    return ProofFile(extra, int(index), hashes, "\n".join(lines[at + 1 :]))


@dataclass(frozen=True)
class Proven:
    """What a verified proof file establishes."""

    leaf: bytes
    index: int
    checkpoint: Checkpoint
    cosigned_at: dict[str, int]


def verify_proof(
    text: str, key: VerifierKey, origin: str, witnesses: list[VerifierKey], quorum: int, now: int
) -> Proven:
    """tlog-proof's four steps: the leaf hash (here: of the extra data), the log's signature, the
    witnesses' cosignatures against a k-of-n quorum, and the inclusion proof."""
    parsed = parse_proof(text)
    if parsed.extra is None:
        raise Rejected("no extra line: the leaf data is not in the proof")
    checkpoint, note = verified_checkpoint(parsed.checkpoint, key, origin)
    cosigned = {w.name: verify_cosignature(note, w, now) for w in witnesses if _signed_by(note, w)}
    if len(cosigned) < quorum:
        raise Rejected(f"{len(cosigned)} witness cosignatures, the quorum is {quorum}")
    good = verify_inclusion(
        parsed.index, checkpoint.size, leaf_hash(parsed.extra), parsed.inclusion_path, checkpoint.root
    )
    if not good:
        raise Rejected("the inclusion proof does not lead to the checkpoint's root")
    return Proven(parsed.extra, parsed.index, checkpoint, cosigned)


def _signed_by(note: Note, key: VerifierKey) -> bool:
    return any(name == key.name and blob[:4] == key.key_id for name, blob in note.signatures)
