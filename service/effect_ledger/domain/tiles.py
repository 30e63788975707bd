"""c2sp.org/tlog-tiles: tile coordinates and paths, growing tiles by appending leaves, reading subtree
hashes back out of tiles, and entry bundles (no I/O).

A tile at level L, index n holds up to 256 hashes: hash i is MTH(D[(n*256+i) * 256**L : +256**L]),
i.e. the node at tree level 8L. A full tile (256 hashes) never changes; the rightmost tile of each
level is partial and grows until it is full.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from effect_ledger.domain.merkle import HASH_SIZE, perfect_root

TILE_WIDTH = 256
TILE_HEIGHT = 8
FULL_TILE_BYTES = TILE_WIDTH * HASH_SIZE
MAX_ENTRY_BYTES = 0xFFFF
ENTRIES = -1  # the "level" under which entry bundles are kept beside the tiles

TileKey = tuple[int, int]  # (level, index)


@dataclass(frozen=True, slots=True)
class TileRef:
    """One tile or entry bundle as addressed by a path: level (ENTRIES for a bundle), index, width."""

    level: int
    index: int
    width: int  # 256 for a full tile

    @property
    def partial(self) -> bool:
        return self.width < TILE_WIDTH


def encode_index(n: int) -> str:
    """Tile index as zero-padded 3-digit path elements, all but the last prefixed with x:
    1234067 -> x001/x234/067."""
    if n < 0:
        raise ValueError("negative tile index")
    parts = [f"{n % 1000:03d}"]
    n //= 1000
    while n > 0:
        parts.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(parts))


def tile_path(ref: TileRef) -> str:
    """The path of a tile or entry bundle below the log's prefix, as c2sp.org/tlog-tiles spells it."""
    level = "entries" if ref.level == ENTRIES else str(ref.level)
    suffix = f".p/{ref.width}" if ref.partial else ""
    return f"tile/{level}/{encode_index(ref.index)}{suffix}"


_PATH = re.compile(r"^tile/(entries|0|[1-9][0-9]?)/((?:x[0-9]{3}/)*[0-9]{3})(?:\.p/([1-9][0-9]{0,2}))?\Z")


def parse_tile_path(path: str) -> TileRef | None:
    """The tile a path names, or None when it is not a well-formed tile path (levels 0-63, widths 1-255)."""
    match = _PATH.match(path)
    if match is None:
        return None
    level_text, index_text, width_text = match.groups()
    level = ENTRIES if level_text == "entries" else int(level_text)
    if level > 63:
        return None
    index = 0
    for element in index_text.split("/"):
        index = index * 1000 + int(element.lstrip("x"))
    if encode_index(index) != index_text:  # one spelling per index
        return None
    width = TILE_WIDTH if width_text is None else int(width_text)
    if width_text is not None and width >= TILE_WIDTH:
        return None
    return TileRef(level, index, width)


def layout(size: int) -> list[TileRef]:
    """Every tile of a tree of `size` leaves (full ones and the partial edge), level by level."""
    out: list[TileRef] = []
    level = 0
    count = size  # hashes at this tile level
    while count > 0:
        full, rest = divmod(count, TILE_WIDTH)
        out.extend(TileRef(level, n, TILE_WIDTH) for n in range(full))
        if rest:
            out.append(TileRef(level, full, rest))
        count = full
        level += 1
    return out


def edge(size: int) -> list[TileRef]:
    """The rightmost tile of every level that a tree of `size` leaves can still grow into (width 0
    where it has no hash yet): what an append must read."""
    out: list[TileRef] = []
    level = 0
    count = size
    while True:
        out.append(TileRef(level, count // TILE_WIDTH, count % TILE_WIDTH))
        if count < TILE_WIDTH:
            return out
        count //= TILE_WIDTH
        level += 1


def append(size: int, edge_tiles: Mapping[int, bytes], leaves: Sequence[bytes]) -> dict[TileKey, bytes]:
    """Append leaf hashes to a tree of `size` leaves whose rightmost tiles are `edge_tiles` (level ->
    bytes); answers every tile that changed, with its new contents. A tile filled to 256 hashes is
    hashed into the level above (it is complete); full tiles are never revisited."""
    counts: list[int] = []
    count = size
    while True:
        counts.append(count)
        if count < TILE_WIDTH:
            break
        count //= TILE_WIDTH
    buffers: dict[int, bytearray] = {}
    for level, count in enumerate(counts):
        have = bytes(edge_tiles.get(level, b""))
        if len(have) != (count % TILE_WIDTH) * HASH_SIZE:
            raise ValueError(f"edge tile at level {level} has the wrong width")
        buffers[level] = bytearray(have)
    changed: dict[TileKey, bytes] = {}
    touched: set[TileKey] = set()
    for leaf in leaves:
        level, carry = 0, leaf
        while True:
            if level >= len(counts):
                counts.append(0)
                buffers[level] = bytearray()
            buf = buffers[level]
            buf += carry
            index = counts[level] // TILE_WIDTH
            counts[level] += 1
            touched.add((level, index))
            if len(buf) < FULL_TILE_BYTES:
                break
            full = changed[(level, index)] = bytes(buf)
            touched.discard((level, index))
            carry = perfect_root([full[i : i + HASH_SIZE] for i in range(0, FULL_TILE_BYTES, HASH_SIZE)])
            buffers[level] = bytearray()
            level += 1
    for level, index in touched:
        changed[(level, index)] = bytes(buffers[level])
    return changed


def node_tiles(nodes: Sequence[tuple[int, int]]) -> set[TileKey]:
    """The tiles that hold what the subtree hashes `nodes` ((tree level, n) pairs) need."""
    out: set[TileKey] = set()
    for k, n in nodes:
        level, rest = divmod(k, TILE_HEIGHT)
        out.add((level, (n << rest) // TILE_WIDTH))
    return out


def read_nodes(nodes: Sequence[tuple[int, int]], tiles: Mapping[TileKey, bytes]) -> list[bytes]:
    """Subtree hashes from tiles: node (k, n) is the balanced root over 2**(k % 8) consecutive hashes
    of one tile at level k // 8. A missing or too narrow tile raises LookupError."""
    out: list[bytes] = []
    for k, n in nodes:
        level, rest = divmod(k, TILE_HEIGHT)
        first = n << rest
        tile = tiles.get((level, first // TILE_WIDTH))
        start = (first % TILE_WIDTH) * HASH_SIZE
        end = start + (HASH_SIZE << rest)
        if tile is None or len(tile) < end:
            raise LookupError(f"tile {level}/{first // TILE_WIDTH} lacks node {k}/{n}")
        out.append(perfect_root([tile[i : i + HASH_SIZE] for i in range(start, end, HASH_SIZE)]))
    return out


def encode_bundle(entries: Sequence[bytes]) -> bytes:
    """An entry bundle: each entry as a big-endian uint16 length and its bytes."""
    out = bytearray()
    for entry in entries:
        if len(entry) > MAX_ENTRY_BYTES:
            raise ValueError("log entry over 65535 bytes")
        out += len(entry).to_bytes(2, "big") + entry
    return bytes(out)


def decode_bundle(data: bytes) -> list[bytes]:
    """The entries of a bundle; ValueError when it is cut short."""
    out: list[bytes] = []
    at = 0
    while at < len(data):
        if at + 2 > len(data):
            raise ValueError("entry bundle cut in a length prefix")
        length = int.from_bytes(data[at : at + 2], "big")
        if at + 2 + length > len(data):
            raise ValueError("entry bundle cut in an entry")
        out.append(data[at + 2 : at + 2 + length])
        at += 2 + length
    return out


def tile_prefix(tile: bytes, width: int) -> bytes | None:
    """The first `width` hashes of a stored tile (a partial tile of that width), or None if narrower."""
    end = width * HASH_SIZE
    return tile[:end] if len(tile) >= end else None
