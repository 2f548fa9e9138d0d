"""Secure aggregation at its floor, round three (issue 32): the faster paths give the same bytes.

Each faster path of round three is checked against the code it replaced, copied here from main
(51fda65): a seeded round of each variant (honest-but-curious, malicious with MACs and with
signatures), with clients dropping before and after masking and values to clip, keeps every
payload (keys, sealed shares, masked uploads, revealed secrets) and its ring sum; the same round
with the old paths patched in must give the same bytes and the same sum.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import fixed_point as fpm
from securefed.crypto import keys as kx
from securefed.crypto import prg
from securefed.randomness import SeedTree as _SeedTree
from securefed.transport.secagg import SecAggConfig, SecAggTransport
from securefed.transport.secagg import client as client_mod
from securefed.transport.secagg import server as server_mod


# -- the replaced code, as main had it --------------------------------------------------------
def _old_derive_key(shared_secret: bytes, info: bytes, *, length: int = kx.KEY_BYTES) -> bytes:
    if not 1 <= length <= kx.HKDF_MAX_BYTES:
        raise ValueError("length")
    prk = hmac.digest(kx.PROTOCOL_LABEL, shared_secret, "sha256")
    blocks, previous = [], b""
    for counter in range(1, -(-length // 32) + 1):
        previous = hmac.digest(prk, previous + info + bytes([counter]), "sha256")
        blocks.append(previous)
    return b"".join(blocks)[:length]


def _old_key(self, *path, nbytes: int = 32) -> bytes:
    words = self.sequence(*path).generate_state((nbytes + 3) // 4, dtype=np.uint32)
    return words.tobytes()[:nbytes]


def _old_encode_blocks(self, values, uniform_blocks):
    fp = self.fixed_point
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (self.length,):
        raise ValueError(f"expected {self.length} values, got {values.shape}")
    if not (self.length and -fp.clip <= values.min() and values.max() <= fp.clip):
        gathered = [np.array(block, dtype=np.float64) for block in uniform_blocks]
        uniform = np.concatenate(gathered) if gathered else np.empty(0)
        return self.encode(values, uniform)
    signed = np.empty(self.length, np.int32 if fp.bits == 32 else np.int64)
    start = 0
    for uniform in uniform_blocks:
        stop = start + len(uniform)
        size = stop - start
        z, floor, up = self._scaled[:size], self._floor[:size], self._up[:size]
        np.multiply(values[start:stop], fp.scale, out=z)
        np.floor(z, out=floor)
        np.subtract(z, floor, out=z)
        np.less(uniform, z, out=up)
        out = signed[start:stop]
        np.copyto(out, floor, casting="unsafe")
        np.add(out, up, out=out, casting="unsafe")
        start = stop
    ring = signed.view(np.uint32 if fp.bits == 32 else np.uint64)
    return ring.astype(fp.dtype, copy=False), 0


def _nonces_one_by_one(self, n: int) -> bytes:
    """main's share(): one ``randbytes(12)`` per neighbour; a batched request is served as
    those successive requests (the draw is the stream's or the OS's either way)."""
    if n > kx.NONCE_BYTES and n % kx.NONCE_BYTES == 0:
        return b"".join(_ORIGINAL_RANDBYTES(self, kx.NONCE_BYTES) for _ in range(n // 12))
    return _ORIGINAL_RANDBYTES(self, n)


_ORIGINAL_RANDBYTES = client_mod._ClientRandomness.randbytes


def _patch_old_paths(monkeypatch) -> None:
    monkeypatch.setattr(kx, "derive_key", _old_derive_key)
    monkeypatch.setattr(_SeedTree, "key", _old_key)
    monkeypatch.setattr(fpm.Encoder, "encode_blocks", _old_encode_blocks)
    monkeypatch.setattr(server_mod, "_client_block", lambda updates, k: updates.client_block(k))
    monkeypatch.setattr(client_mod._ClientRandomness, "randbytes", _nonces_one_by_one)


# -- the round ---------------------------------------------------------------------------------
N_CLIENTS, LENGTH = 12, 2500
VARIANTS = [
    {"server": "honest_but_curious"},
    {"server": "malicious", "auth": "macs"},
    {"server": "malicious", "auth": "signatures"},
]


def _values() -> np.ndarray:
    rng = np.random.default_rng(32)
    values = rng.uniform(-1, 1, (N_CLIENTS, LENGTH))
    values[1, ::97] = rng.uniform(-4, 4, len(values[1, ::97]))  # some values to clip
    values[2, -3:] = [1.0, -1.0, 2**-1074]  # the clip range's ends, a subnormal
    return values


def _round_bytes(variant: dict) -> tuple[dict, np.ndarray, np.ndarray]:
    """Every payload the view keeps (SHA-256 per client and field), the ring sum and the
    decoded total of one seeded round: client 3 drops before masking, client 5 after."""
    config = SecAggConfig(neighbours=7, out_of_range="clip", **variant)
    transport = SecAggTransport(config, keep_payloads=ALL_PAYLOADS)
    values = _values()
    rnd = transport.open_round(0, range(N_CLIENTS), shape=(1, LENGTH), seeds=SeedTree(11))
    rnd.drop(3)
    for c in range(N_CLIENTS):
        if c != 3:
            rnd.submit(c, values[c])
    rnd.drop(5)
    total = rnd.result().total
    payloads = {
        (c, name): hashlib.sha256(np.ascontiguousarray(field).tobytes()).hexdigest()
        for c, fields in rnd.view.payloads.items()
        for name, field in fields.items()
    }
    return payloads, np.array(rnd.view.aggregate["ring_sum"]), total


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_a_round_gives_the_bytes_and_the_sum_of_the_old_paths(monkeypatch, variant):
    """Keys, sealed shares, masked uploads, revealed secrets and the ring sum, bit for bit,
    against the same round through main's paths (main's block by block encoding: see
    test_secagg_floor_round4)."""
    new_payloads, new_sum, new_total = _round_bytes(variant)
    _patch_old_paths(monkeypatch)
    old_payloads, old_sum, old_total = _round_bytes(variant)
    assert new_payloads == old_payloads
    kinds = {name for _, name in new_payloads}
    assert {"masked_sha256", "shares_sent", "revealed_self_seed", "revealed_mask_key"} <= kinds
    np.testing.assert_array_equal(new_sum, old_sum)
    np.testing.assert_array_equal(new_total, old_total)
    expected = np.delete(np.clip(_values(), -1, 1), 3, axis=0).sum(axis=0)
    np.testing.assert_allclose(new_total[0], expected, atol=1e-3)


def test_the_patched_old_paths_do_change_what_they_replace(monkeypatch):
    """The comparison above can fail: an old path that drew its nonces from another stream
    position gives other sealed shares (so the equality is not vacuous)."""
    new_payloads, _, _ = _round_bytes(VARIANTS[0])

    def shifted(self, n):
        _ORIGINAL_RANDBYTES(self, 1)
        return _ORIGINAL_RANDBYTES(self, n)

    monkeypatch.setattr(client_mod._ClientRandomness, "randbytes", shifted)
    other, _, _ = _round_bytes(VARIANTS[0])
    changed = {key for key in new_payloads if new_payloads[key] != other[key]}
    assert any(name == "shares_sent" for _, name in changed)


def test_the_derived_pair_key_is_rfc5869s_first_block():
    """The one-block HKDF path against RFC 5869's test case 1 (truncated to 32 bytes) and the
    loop it replaced, for every length the loop serves."""
    ikm = bytes.fromhex("0b" * 22)
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    okm = bytes.fromhex(
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )
    prk = hmac.digest(salt, ikm, "sha256")
    assert hmac.digest(prk, info + b"\x01", "sha256") == okm[:32]
    rng = np.random.default_rng(5)
    for length in (1, 31, 32, 33, 64, 65, kx.HKDF_MAX_BYTES):
        secret, info = rng.bytes(32), rng.bytes(int(rng.integers(0, 80)))
        assert kx.derive_key(secret, info, length=length) == _old_derive_key(
            secret, info, length=length
        )


@pytest.mark.parametrize("seed", [0, 7, 2**64 + 5, 2**200 + 3, None])
def test_seed_tree_keys_are_numpys_seed_sequence_states(seed):
    """SeedTree.key with its prefix pools kept gives numpy's SeedSequence bytes for every path
    (strings, small and large ints, any length, any order of asking), secure trees included."""
    tree, rng = SeedTree(seed), np.random.default_rng(2 if seed is None else seed % 1000)
    names = ("secagg", "graph", "rounding", "c", "stream")
    for _ in range(300):
        path = tuple(
            names[int(rng.integers(len(names)))]
            if rng.random() < 0.4
            else int(rng.integers(0, 2**45 if rng.random() < 0.3 else 100))
            for _ in range(int(rng.integers(0, 5)))
        )
        nbytes = int(rng.integers(0, 70))
        expected = tree.sequence(*path).generate_state((nbytes + 3) // 4, dtype=np.uint32)
        assert tree.key(*path, nbytes=nbytes) == expected.tobytes()[:nbytes], path


def test_a_resumed_secure_tree_forgets_the_pools_of_its_old_entropy():
    tree = SeedTree()
    before = tree.key("secagg", 0, 1, "b")
    tree.resume_from(12345)
    expected = np.random.SeedSequence(12345, spawn_key=tree.sequence("secagg", 0, 1, "b").spawn_key)
    assert tree.key("secagg", 0, 1, "b") == expected.generate_state(8, np.uint32).tobytes()
    assert tree.key("secagg", 0, 1, "b") != before


def test_a_seed_tree_key_refuses_a_negative_length_and_bad_paths():
    with pytest.raises(ValueError, match="nbytes"):
        SeedTree(0).key("a", nbytes=-1)
    with pytest.raises(TypeError, match="ints or strings"):
        SeedTree(0).key("a", 1.5)
    with pytest.raises(ValueError, match=">= 0"):
        SeedTree(0).key("a", -1)


def test_nonces_drawn_at_once_are_the_stream_drawn_one_by_one():
    stream, again = prg.KeystreamBytes(bytes(32)), prg.KeystreamBytes(bytes(32))
    stream(33)
    again(33)
    assert stream(12 * 7) == b"".join(again(12) for _ in range(7))


@pytest.mark.parametrize("bits", [32, 64])
def test_the_fused_range_check_clips_and_counts_block_by_block_as_the_whole_vector(bits):
    """Blocks of every kind (in range, to clip, a subnormal, the ends) in one vector: the ring
    and the count of the whole-vector encoder, whatever the block size."""
    fp = fpm.FixedPoint(bits=bits, scale=2.0**18, clip=1.5)
    rng = np.random.default_rng(bits)
    values = rng.uniform(-1.5, 1.5, 4000)
    values[1000:1200] = rng.uniform(-6, 6, 200)
    values[[0, 1, 2, 3999]] = [1.5, -1.5, 2**-1074, -0.0]
    uniform = prg.uniform_floats(bytes(range(32)), len(values))
    expected, count = fpm.Encoder(fp, len(values)).encode(values, uniform)
    for block in (1, 7, 999, 1000, 4000, 10**5):
        source = prg.UniformSource(len(values))
        ring, n = fpm.Encoder(fp, len(values)).encode_blocks(
            values, source.blocks(bytes(range(32)), block)
        )
        np.testing.assert_array_equal(ring, expected)
        assert n == count > 0
    late_nan = values.copy()
    late_nan[-1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        fpm.Encoder(fp, len(values)).encode_blocks(
            late_nan, prg.UniformSource(len(values)).blocks(bytes(32), 1000)
        )


def test_a_dense_submission_is_encoded_from_the_callers_values_without_a_copy():
    """The dense path hands the client's own rows (a view) and leaves them untouched; a sparse
    submission still gets its full block."""
    from securefed.transport.base import RowUpdates

    vector = np.linspace(-1, 1, 12)
    dense = RowUpdates.single(4, vector)
    block = server_mod._client_block(dense, 0)
    assert np.shares_memory(block, dense.values) and block.shape == (1, 12)
    sparse = RowUpdates(np.array([4]), np.array([0, 1]), np.array([2]), vector[None, :6], 3)
    full = server_mod._client_block(sparse, 0)
    np.testing.assert_array_equal(full, sparse.client_block(0))
    reordered = RowUpdates(
        np.array([4]), np.array([0, 2]), np.array([1, 0]), np.arange(4.0).reshape(2, 2), 2
    )
    np.testing.assert_array_equal(server_mod._client_block(reordered, 0), [[2.0, 3.0], [0.0, 1.0]])


def test_the_floor_split_by_stage_adds_up_to_the_full_floor_and_the_accumulation():
    """Every operation of the full floor lands in exactly one stage; the server's sum of the
    uploads and its key checks in "untimed" (the accumulation the floor's masks leave out)."""
    from securefed.bench.bench_secagg import (
        _KEYS,
        _MASKING,
        _REST,
        _SIGNING,
        floor_by_stage,
        floor_seconds,
    )

    n, k, contributors, dangling = 10, 4, 8, 5
    ops = {
        "mask_expansion": contributors * (1 + k) + contributors + dangling,
        "rounding_draw": contributors,
        "x25519": n * k + contributors * k + dangling,
        "x25519_keygen": 2 * n + 2,
        "ed25519_sign": 18,
        "ed25519_verify": 50,
        "hmac": 7,
        "static_x25519": 3,
        "hkdf": n * k + contributors * k + dangling,
        "aead_seal": n * k,
        "aead_open": 30,
        "shamir_split": 2 * n,
        "shamir_reconstruct": contributors + 2,
        "ring_add": contributors,
        "key_check": 2 * n,
    }
    costs = {name: float(i + 1) for i, name in enumerate(ops)}
    split = floor_by_stage(ops, costs, clients=n, k=k)
    full = floor_seconds(ops, costs, _MASKING + _KEYS + _SIGNING + _REST)
    assert sum(v for s, v in split.items() if s not in ("setup", "untimed")) == pytest.approx(full)
    assert split["setup"] == ops["static_x25519"] * costs["x25519"]
    assert split["untimed"] == contributors * costs["ring_add"] + 2 * n * costs["x25519"]
    assert split["encoding"] == contributors * costs["rounding_draw"]
