"""The Merkle log's pure code against RFC 6962's definitions and the C2SP fixed vectors.

Roots and proofs are computed from tiles (domain/tiles.py) and compared with a naive tree built
straight from RFC 6962 for every size up to 300, and for random sizes up to a million through a
fast path (all tree levels built once); every single-bit mutation of a proof must fail.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effect_ledger.domain import merkle, tiles
from effect_ledger.domain.merkle import (
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    naive_root,
    node_hash,
    perfect_root,
    tree_root,
    verify_consistency,
    verify_inclusion,
)


def leaves(n: int) -> list[bytes]:
    return [leaf_hash(i.to_bytes(8, "big")) for i in range(n)]


@cache
def leaf_list(n: int) -> tuple[bytes, ...]:
    return tuple(leaves(n))


def tile_store(hashes: Sequence[bytes], *, step: int = 37) -> dict[tuple[int, int], bytes]:
    """Tiles of a log grown in appends of `step` leaves (so partial tiles are extended many times)."""
    store: dict[tuple[int, int], bytes] = {}
    size = 0
    while size < len(hashes):
        batch = hashes[size : size + step]
        edge = {ref.level: store.get((ref.level, ref.index), b"") for ref in tiles.edge(size)}
        store.update(tiles.append(size, edge, batch))
        size += len(batch)
    return store


def reader(store: dict[tuple[int, int], bytes]) -> merkle.NodeReader:
    return lambda nodes: tiles.read_nodes(nodes, store)


# ---- the naive tree (RFC 6962 section 2.1, as written) -------------------------------------------


def naive_path(m: int, d: Sequence[bytes]) -> list[bytes]:
    n = len(d)
    if n == 1:
        return []
    k = 1 << ((n - 1).bit_length() - 1)
    if m < k:
        return [*naive_path(m, d[:k]), naive_root(d[k:])]
    return [*naive_path(m - k, d[k:]), naive_root(d[:k])]


def naive_subproof(m: int, d: Sequence[bytes], b: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if b else [naive_root(d)]
    k = 1 << ((n - 1).bit_length() - 1)
    if m <= k:
        return [*naive_subproof(m, d[:k], b), naive_root(d[k:])]
    return [*naive_subproof(m - k, d[k:], False), naive_root(d[:k])]


def naive_consistency(m: int, d: Sequence[bytes]) -> list[bytes]:
    return [] if m in (0, len(d)) else naive_subproof(m, d, True)


def mutations(proof: list[bytes]) -> list[list[bytes]]:
    """Every proof one change away: each hash with one bit flipped, a hash dropped, one added."""
    out = []
    for i, h in enumerate(proof):
        for bit in (0, 77, 255):
            flipped = bytearray(h)
            flipped[bit // 8] ^= 1 << (bit % 8)
            out.append([*proof[:i], bytes(flipped), *proof[i + 1 :]])
        out.append(proof[:i] + proof[i + 1 :])
    out.append([*proof, hashlib.sha256(b"extra").digest()])
    return out


# ---- every size up to 300 ------------------------------------------------------------------------

SMALL = 300


@pytest.fixture(scope="module")
def small_store() -> dict[tuple[int, int], bytes]:
    return tile_store(leaf_list(SMALL))


def test_roots_from_tiles_equal_the_naive_tree_for_every_size(
    small_store: dict[tuple[int, int], bytes],
) -> None:
    d = leaf_list(SMALL)
    read = reader(small_store)
    assert tree_root(0, read) == hashlib.sha256(b"").digest()
    for size in range(1, SMALL + 1):
        assert tree_root(size, read) == naive_root(d[:size]), size


def test_inclusion_proofs_from_tiles_equal_the_naive_ones_and_verify(
    small_store: dict[tuple[int, int], bytes],
) -> None:
    d = leaf_list(SMALL)
    read = reader(small_store)
    for size in [*list(range(1, 70)), 127, 128, 129, 255, 256, 257, 299, 300]:
        root = naive_root(d[:size])
        for index in range(size):
            proof = inclusion_proof(index, size, read)
            assert proof == naive_path(index, d[:size]), (index, size)
            assert verify_inclusion(index, size, d[index], proof, root)
            assert not verify_inclusion(index, size, node_hash(d[index], d[index]), proof, root)
            if index + 1 < size:
                assert (
                    not verify_inclusion(index + 1, size, d[index], proof, root) or d[index] == d[index + 1]
                )


def test_consistency_proofs_from_tiles_equal_the_naive_ones_and_verify(
    small_store: dict[tuple[int, int], bytes],
) -> None:
    d = leaf_list(SMALL)
    read = reader(small_store)
    for new in [*list(range(1, 80)), 255, 256, 257, 300]:
        new_root = naive_root(d[:new])
        for old in range(0, new + 1):
            proof = consistency_proof(old, new, read)
            assert proof == naive_consistency(old, d[:new]), (old, new)
            old_root = naive_root(d[:old])
            assert verify_consistency(old, new, old_root, new_root, proof), (old, new)
            if 0 < old < new:
                assert not verify_consistency(old, new, leaf_hash(b"x"), new_root, proof)
                assert not verify_consistency(old, new, old_root, leaf_hash(b"x"), proof)


def test_every_mutated_proof_fails(small_store: dict[tuple[int, int], bytes]) -> None:
    d = leaf_list(SMALL)
    read = reader(small_store)
    for size in (2, 3, 7, 8, 100, 256, 257, 300):
        root = naive_root(d[:size])
        for index in {0, 1, size // 2, size - 1}:
            proof = inclusion_proof(index, size, read)
            for bad in mutations(proof):
                assert not verify_inclusion(index, size, d[index], bad, root), (index, size)
        for old in {1, 2, size // 3, size - 1}:
            if not 0 < old < size:
                continue
            proof = consistency_proof(old, size, read)
            for bad in mutations(proof):
                assert not verify_consistency(old, size, naive_root(d[:old]), root, bad), (old, size)


def test_a_perfect_tree_is_hashed_level_by_level_as_the_naive_recursion_does() -> None:
    """perfect_root (full tiles and the aligned subtrees in them) against RFC 6962's recursion, for
    every power of two a tile holds; a count that is no power of two is refused, not hashed."""
    hashes = [leaf_hash(bytes([i % 256, i // 256])) for i in range(256)]
    for width in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for start in (0, 256 - width):
            assert perfect_root(hashes[start : start + width]) == naive_root(hashes[start : start + width])
    assert perfect_root(hashes) != perfect_root(hashes[::-1])
    for count in (0, 3, 6, 255):
        with pytest.raises(ValueError):
            perfect_root(hashes[:count])


def test_out_of_range_proofs_are_refused() -> None:
    d = leaves(4)
    root = naive_root(d)
    assert not verify_inclusion(4, 4, d[0], [], root)
    assert not verify_inclusion(-1, 4, d[0], [], root)
    assert not verify_consistency(5, 4, root, root, [])
    assert verify_consistency(4, 4, root, root, [])
    assert not verify_consistency(4, 4, root, leaf_hash(b"y"), [])
    assert verify_consistency(0, 4, b"\0" * 32, root, [])


# ---- random sizes up to a million, through a fast path ---------------------------------------------

BIG = 1_000_000


@pytest.fixture(scope="module")
def big() -> tuple[list[list[bytes]], dict[tuple[int, int], bytes]]:
    """All levels of the complete subtrees of a million leaves (the fast path), and its tiles."""
    d = [hashlib.sha256(b"\x00" + i.to_bytes(4, "big")).digest() for i in range(BIG)]
    levels = [d]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append([node_hash(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)])
    return levels, tile_store(d, step=4099)


def fast_root(levels: list[list[bytes]], lo: int, hi: int) -> bytes:
    """MTH(D[lo:hi]) by RFC 6962's recursion, taking complete aligned subtrees from the levels."""
    n = hi - lo
    if n & (n - 1) == 0 and lo % n == 0:
        return levels[n.bit_length() - 1][lo // n]
    k = 1 << ((n - 1).bit_length() - 1)
    return node_hash(fast_root(levels, lo, lo + k), fast_root(levels, lo + k, hi))


def fast_path(levels: list[list[bytes]], m: int, lo: int, hi: int) -> list[bytes]:
    if hi - lo == 1:
        return []
    k = 1 << ((hi - lo - 1).bit_length() - 1)
    if m < lo + k:
        return [*fast_path(levels, m, lo, lo + k), fast_root(levels, lo + k, hi)]
    return [*fast_path(levels, m, lo + k, hi), fast_root(levels, lo, lo + k)]


def fast_subproof(levels: list[list[bytes]], m: int, lo: int, hi: int, b: bool) -> list[bytes]:
    if m == hi - lo:
        return [] if b else [fast_root(levels, lo, hi)]
    k = 1 << ((hi - lo - 1).bit_length() - 1)
    if m <= k:
        return [*fast_subproof(levels, m, lo, lo + k, b), fast_root(levels, lo + k, hi)]
    return [*fast_subproof(levels, m - k, lo + k, hi, False), fast_root(levels, lo, lo + k)]


def test_random_sizes_up_to_a_million(big: tuple[list[list[bytes]], dict[tuple[int, int], bytes]]) -> None:
    levels, store = big
    read = reader(store)
    rng = random.Random(20261201)
    sizes = [BIG, 65536, 65537, 70000, 256**2 + 256 + 1] + [rng.randint(1, BIG) for _ in range(60)]
    for size in sizes:
        root = fast_root(levels, 0, size)
        assert tree_root(size, read) == root, size
        for index in (0, size - 1, rng.randrange(size)):
            proof = inclusion_proof(index, size, read)
            assert proof == fast_path(levels, index, 0, size)
            assert verify_inclusion(index, size, levels[0][index], proof, root)
        old = rng.randint(1, size)
        proof = consistency_proof(old, size, read)
        assert proof == ([] if old == size else fast_subproof(levels, old, 0, size, True))
        assert verify_consistency(old, size, fast_root(levels, 0, old), root, proof)
        for bad in mutations(proof)[:6]:
            assert not verify_consistency(old, size, fast_root(levels, 0, old), root, bad)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=600), min_size=1, max_size=6))
def test_any_sequence_of_appends_gives_the_same_tiles(sizes: list[int]) -> None:
    total = sum(sizes)
    d = leaves(total)
    store: dict[tuple[int, int], bytes] = {}
    size = 0
    for n in sizes:
        edge = {ref.level: store.get((ref.level, ref.index), b"") for ref in tiles.edge(size)}
        store.update(tiles.append(size, edge, d[size : size + n]))
        size += n
    assert store == tile_store(d, step=total)
    assert {(r.level, r.index): r.width for r in tiles.layout(total)} == {
        k: len(v) // 32 for k, v in store.items() if v
    }


# ---- C2SP fixed vectors ----------------------------------------------------------------------------


def test_tile_path_encoding_matches_the_spec() -> None:
    assert tiles.encode_index(1234067) == "x001/x234/067"
    assert tiles.encode_index(0) == "000"
    assert tiles.encode_index(1000) == "x001/000"
    ref = tiles.TileRef(0, 1234067, 256)
    assert tiles.tile_path(ref) == "tile/0/x001/x234/067"
    assert tiles.tile_path(tiles.TileRef(2, 67, 17)) == "tile/2/067.p/17"
    assert tiles.tile_path(tiles.TileRef(tiles.ENTRIES, 5, 1)) == "tile/entries/005.p/1"
    assert tiles.parse_tile_path("tile/0/x001/x234/067") == ref
    assert tiles.parse_tile_path("tile/entries/x001/000.p/255") == tiles.TileRef(tiles.ENTRIES, 1000, 255)
    for bad in (
        "tile/0/1234067",
        "tile/0/001/234/067",  # the x prefix is required on all but the last element
        "tile/0/x000/067",  # one spelling per index: no leading zero element
        "tile/64/000",
        "tile/01/000",
        "tile/0/000.p/0",
        "tile/0/000.p/256",
        "tile/0/000.p/007",
        "tile/0/67",
    ):
        assert tiles.parse_tile_path(bad) is None, bad


def test_the_70000_leaf_layout_of_the_spec() -> None:
    refs = tiles.layout(70_000)
    by_level: dict[int, list[tiles.TileRef]] = {}
    for ref in refs:
        by_level.setdefault(ref.level, []).append(ref)
    assert sorted(by_level) == [0, 1, 2]
    assert sum(1 for r in by_level[0] if not r.partial) == 273
    assert [r.width for r in by_level[0] if r.partial] == [112]
    assert [(r.width, r.partial) for r in by_level[1]] == [(256, False), (17, True)]
    assert [(r.index, r.width) for r in by_level[2]] == [(0, 1)]
    assert [(r.level, r.width) for r in tiles.layout(256)] == [(0, 256), (1, 1)]


def test_entry_bundles_round_trip_and_refuse_cut_data() -> None:
    entries = [b"", b"a", b"x" * 300, bytes(range(256))]
    data = tiles.encode_bundle(entries)
    assert data[:2] == b"\x00\x00" and data[2:4] == b"\x00\x01"
    assert tiles.decode_bundle(data) == entries
    with pytest.raises(ValueError):
        tiles.decode_bundle(data[:-1])
    with pytest.raises(ValueError):
        tiles.encode_bundle([b"x" * 65536])
