"""Tests of the cryptographic building blocks: Shamir, keys/AEAD, PRG, fixed point."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from securefed.crypto import fixed_point as fpm
from securefed.crypto import keys as kx
from securefed.crypto import prg, shamir
from securefed.errors import AggregationError


def _seeded_bytes(seed: int):
    rng = random.Random(seed)
    return lambda n: rng.randbytes(n)


def _is_probable_prime(n: int, rounds: int = 40) -> bool:
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    rng = random.Random(12345)
    for _ in range(rounds):
        x = pow(rng.randrange(2, n - 1), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


# ----------------------------------------------------------------------------- Shamir
def test_field_modulus_is_the_smallest_prime_above_2_256():
    assert _is_probable_prime(shamir.PRIME)
    assert not any(_is_probable_prime(2**256 + c) for c in range(1, 297, 2))


def test_field_arithmetic():
    rng = random.Random(1)
    for _ in range(50):
        a = rng.randrange(1, shamir.PRIME)
        assert a * shamir.field_inverse(a) % shamir.PRIME == 1
    values = [rng.randrange(1, shamir.PRIME) for _ in range(20)]
    assert shamir.batch_inverse(values) == [shamir.field_inverse(v) for v in values]
    with pytest.raises(ZeroDivisionError):
        shamir.field_inverse(shamir.PRIME)
    # Horner evaluation: 3 + 2x + x^2 at x = 5 is 38.
    assert shamir.poly_eval([3, 2, 1], 5) == 38
    assert shamir.poly_eval([shamir.PRIME - 1, 1], 1) == 0


def test_random_field_elements_are_in_range_and_spread():
    randbytes = _seeded_bytes(2)
    draws = [shamir.random_field_element(randbytes) for _ in range(400)]
    assert all(0 <= d < shamir.PRIME for d in draws)
    assert len(set(draws)) == len(draws)
    top_bits = np.array([d >> 254 for d in draws])  # p ~ 2^256: 4 roughly equal quarters
    assert set(top_bits.tolist()) == {0, 1, 2, 3}


@settings(max_examples=40, deadline=None)
@given(
    secret=st.integers(0, 2**256 - 1),
    n=st.integers(1, 12),
    data=st.data(),
)
def test_shamir_reconstructs_from_any_t_shares(secret, n, data):
    t = data.draw(st.integers(1, n))
    xs = data.draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True))
    ys = shamir.split(secret, t, xs, _seeded_bytes(secret % 997))
    subset = data.draw(st.lists(st.sampled_from(range(n)), min_size=t, max_size=n, unique=True))
    points = [(xs[i], ys[i]) for i in subset]
    assert shamir.reconstruct(points, t) == secret
    assert shamir.interpolate_at_zero(points) == secret  # more than t points: same polynomial
    # Round trip through bytes.
    assert shamir.int_to_secret(secret) == secret.to_bytes(32, "big")
    assert all(shamir.decode_share(shamir.encode_share(y)) == y for y in ys)


def test_shamir_t_minus_one_shares_refuse_or_give_garbage():
    secret = shamir.secret_to_int(os.urandom(32))
    xs = list(range(1, 8))
    ys = shamir.split(secret, 5, xs, os.urandom)
    points = list(zip(xs, ys, strict=True))[:4]
    with pytest.raises(ValueError, match="1 more"):
        shamir.reconstruct(points, 5)
    assert shamir.interpolate_at_zero(points) != secret
    # Perfect secrecy: the 4 shares are consistent with *any* secret s': completing them with the
    # fifth share of the degree-4 polynomial through (0, s') and the 4 points rebuilds s'.
    other = (secret + 12345) % shamir.PRIME
    fifth_x = 99
    fifth_y = _evaluate_through([(0, other), *points], fifth_x)
    assert shamir.reconstruct([*points, (fifth_x, fifth_y)], 5) == other


def _evaluate_through(points, x):
    """Value at ``x`` of the polynomial of degree < len(points) through ``points`` (mod p)."""
    p = shamir.PRIME
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num = num * (x - xj) % p
                den = den * (xi - xj) % p
        total = (total + yi * num * pow(den, -1, p)) % p
    return total


def test_shamir_rejects_bad_inputs():
    with pytest.raises(ValueError, match="threshold"):
        shamir.split(1, 0, [1, 2], os.urandom)
    with pytest.raises(ValueError, match="threshold"):
        shamir.split(1, 3, [1, 2], os.urandom)
    with pytest.raises(ValueError, match="distinct"):
        shamir.split(1, 2, [1, 1], os.urandom)
    with pytest.raises(ValueError, match="non-zero"):
        shamir.split(1, 1, [shamir.PRIME], os.urandom)
    with pytest.raises(ValueError, match="32-byte"):
        shamir.int_to_secret(2**256)
    with pytest.raises(ValueError):
        shamir.decode_share(b"\xff" * 33)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_share_is_checked_and_wrong_ones_corrected_or_refused(data):
    """Shamir shares are a Reed-Solomon codeword: ``m - t`` spare shares detect that many wrong
    ones and correct ``floor((m - t) / 2)`` (Berlekamp-Welch), naming them."""
    t = data.draw(st.integers(1, 8), label="t")
    m = data.draw(st.integers(t, t + 7), label="m")
    xs = data.draw(st.lists(st.integers(1, 500), min_size=m, max_size=m, unique=True), label="xs")
    seed = data.draw(st.integers(0, 2**32), label="seed")
    rng = random.Random(seed)
    secret = rng.randrange(shamir.PRIME)
    points = list(zip(xs, shamir.split(secret, t, xs, _seeded_bytes(seed)), strict=True))
    assert shamir.shares_consistent(points, t)
    assert shamir.decode_shares(points, t) == (secret, ())
    n_wrong = data.draw(st.integers(0, m - t), label="wrong")
    if n_wrong == 0:
        return
    wrong = set(rng.sample(range(m), n_wrong))
    bad = [
        (x, (y + rng.randrange(1, shamir.PRIME)) % shamir.PRIME) if i in wrong else (x, y)
        for i, (x, y) in enumerate(points)
    ]
    assert not shamir.shares_consistent(bad, t)
    if n_wrong <= (m - t) // 2:
        value, named = shamir.decode_shares(bad, t)
        assert value == secret and sorted(named) == sorted(xs[i] for i in wrong)
    else:
        with pytest.raises(shamir.InconsistentSharesError, match="inconsistent") as refused:
            shamir.decode_shares(bad, t)
        assert sorted(refused.value.suspects) == sorted(xs)


def test_decode_shares_refuses_too_few_shares_and_bad_points():
    points = list(zip([1, 2, 3], shamir.split(7, 3, [1, 2, 3], os.urandom), strict=True))
    with pytest.raises(ValueError, match="1 more"):
        shamir.decode_shares(points[:2], 3)
    with pytest.raises(ValueError, match="distinct"):
        shamir.decode_shares([*points, points[0]], 3)
    with pytest.raises(ValueError, match="threshold"):
        shamir.decode_shares(points, 0)
    assert issubclass(shamir.InconsistentSharesError, ValueError)


# ----------------------------------------------------------------------------- keys and AEAD
P25519 = 2**255 - 19


@pytest.mark.parametrize(
    "public",
    [
        bytes(32),  # u = 0
        (1).to_bytes(32, "little"),
        (P25519 - 1).to_bytes(32, "little"),
        bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
        bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    ],
)
def test_low_order_public_keys_are_refused_by_name(public):
    a = kx.generate_keypair()
    with pytest.raises(kx.InvalidPublicKeyError, match="client 7's X25519 public key is a low"):
        kx.check_public_key(public, owner="client 7")
    with pytest.raises(kx.InvalidPublicKeyError, match="client 9's"):
        kx.pair_key(a.private, public, kx.PURPOSE_PAIR_MASK, 0, 1, 9)


def test_public_keys_must_be_canonical_and_32_bytes():
    a, b = kx.generate_keypair(), kx.generate_keypair()
    assert kx.check_public_key(b.public) == b.public
    high_bit = bytes([*b.public[:31], b.public[31] | 0x80])
    for bad, match in [
        (high_bit, "not canonical"),
        (P25519.to_bytes(32, "little"), "not canonical"),
        ((P25519 + 5).to_bytes(32, "little"), "not canonical"),
        (b"\x01" * 31, "32 bytes"),
    ]:
        with pytest.raises(kx.InvalidPublicKeyError, match=match):
            kx.check_public_key(bad)
        with pytest.raises(kx.InvalidPublicKeyError, match=match):
            kx.agree(a.private, bad)
    assert issubclass(kx.InvalidPublicKeyError, AggregationError)
    assert issubclass(kx.InvalidPublicKeyError, ValueError)


def test_x25519_agreement_is_symmetric_and_seeded_keys_reproduce():
    a, b = kx.generate_keypair(), kx.generate_keypair()
    assert kx.agree(a.private, b.public) == kx.agree(b.private, a.public)
    k1 = kx.pair_key(a.private, b.public, kx.PURPOSE_PAIR_MASK, 3, 1, 2)
    k2 = kx.pair_key(b.private, a.public, kx.PURPOSE_PAIR_MASK, 3, 2, 1)
    assert k1 == k2 and len(k1) == 32
    # The info binds purpose, round and pair.
    assert k1 != kx.pair_key(a.private, b.public, kx.PURPOSE_SHARE_KEY, 3, 1, 2)
    assert k1 != kx.pair_key(a.private, b.public, kx.PURPOSE_PAIR_MASK, 4, 1, 2)
    assert k1 != kx.pair_key(a.private, b.public, kx.PURPOSE_PAIR_MASK, 3, 1, 5)
    seed = bytes(range(32))
    assert kx.keypair_from_seed(seed).public == kx.keypair_from_seed(seed).public
    assert kx.public_from_private_bytes(kx.keypair_from_seed(seed).private_bytes()) == (
        kx.keypair_from_seed(seed).public
    )
    with pytest.raises(ValueError):
        kx.keypair_from_seed(b"short")
    with pytest.raises(ValueError):
        kx.agree(a.private, b"\x01" * 31)


@pytest.mark.parametrize("aead", kx.AEAD_NAMES)
def test_aead_detects_tampering_misrouting_and_replay(aead):
    key = os.urandom(32)
    plaintext = os.urandom(66)
    blob = kx.seal(aead, key, os.urandom(12), plaintext, kx.share_aad(7, 1, 2))
    assert len(blob) == kx.encrypted_size(66) == 94
    assert kx.open_sealed(aead, key, blob, kx.share_aad(7, 1, 2)) == plaintext
    tampered = bytearray(blob)
    tampered[20] ^= 1
    for bad_blob, aad in [
        (bytes(tampered), kx.share_aad(7, 1, 2)),  # altered ciphertext
        (blob, kx.share_aad(7, 1, 3)),  # relayed to the wrong recipient
        (blob, kx.share_aad(7, 4, 2)),  # attributed to another sender
        (blob, kx.share_aad(8, 1, 2)),  # replayed in another round
        (blob[:20], kx.share_aad(7, 1, 2)),  # truncated
    ]:
        with pytest.raises(kx.ShareDecryptionError):
            kx.open_sealed(aead, key, bad_blob, aad)
    with pytest.raises(kx.ShareDecryptionError):
        kx.open_sealed(aead, os.urandom(32), blob, kx.share_aad(7, 1, 2))
    assert issubclass(kx.ShareDecryptionError, AggregationError)


# ----------------------------------------------------------------------------- PRG
@pytest.mark.parametrize("name", prg.PRG_NAMES)
@pytest.mark.parametrize("bits", [32, 64])
def test_prg_is_deterministic_distinct_and_domain_separated(name, bits):
    key = bytes(range(32))
    a = prg.expand_mask(key, 5000, bits=bits, prg=name, domain=prg.DOMAIN_PAIR_MASK)
    b = prg.expand_mask(key, 5000, bits=bits, prg=name, domain=prg.DOMAIN_PAIR_MASK)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == prg.ring_dtype(bits)
    other_key = prg.expand_mask(
        bytes(31) + b"\x01", 5000, bits=bits, prg=name, domain=prg.DOMAIN_PAIR_MASK
    )
    other_domain = prg.expand_mask(key, 5000, bits=bits, prg=name, domain=prg.DOMAIN_SELF_MASK)
    assert np.mean(a == other_key) < 0.01 and np.mean(a == other_domain) < 0.01
    # A prefix is stable (streaming) and the full 32-byte key matters (no seed squeezing).
    np.testing.assert_array_equal(
        prg.expand_mask(key, 100, bits=bits, prg=name, domain=prg.DOMAIN_PAIR_MASK), a[:100]
    )
    near_key = bytes(range(31)) + b"\x00"  # differs only in the last byte
    assert not np.array_equal(
        prg.expand_mask(near_key, 100, bits=bits, prg=name, domain=prg.DOMAIN_PAIR_MASK), a[:100]
    )
    # Uniform: the top byte of each word is flat.
    top = (a >> np.array(bits - 8, dtype=a.dtype)).astype(np.int64)
    assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-3


@pytest.mark.parametrize("name", prg.PRG_NAMES)
def test_mask_expander_matches_expand_mask_and_wraps(name):
    key, length = os.urandom(32), 1000
    expander = prg.MaskExpander(length, bits=32, prg=name)
    acc = np.zeros(length, prg.ring_dtype(32))
    expander.add(acc, key, domain=prg.DOMAIN_SELF_MASK)
    np.testing.assert_array_equal(
        acc, prg.expand_mask(key, length, bits=32, prg=name, domain=prg.DOMAIN_SELF_MASK)
    )
    expander.add(acc, key, domain=prg.DOMAIN_SELF_MASK, sign=-1)
    assert not acc.any()  # + mask - mask = 0 mod 2^32
    with pytest.raises(ValueError, match="32-byte"):
        expander.add(acc, key[:16], domain=prg.DOMAIN_SELF_MASK)
    with pytest.raises(ValueError, match="sign"):
        expander.add(acc, key, domain=prg.DOMAIN_SELF_MASK, sign=2)


def test_uniform_floats_and_keystream_bytes():
    key = os.urandom(32)
    u = prg.uniform_floats(key, 20000)
    assert u.min() >= 0 and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    np.testing.assert_array_equal(prg.UniformSource(20000).draw(key), u)
    stream = prg.KeystreamBytes(key)
    assert stream(10) + stream(6) == prg.KeystreamBytes(key)(16)


# ----------------------------------------------------------------------------- fixed point
def test_fixed_point_round_trip_and_signed_decoding():
    for bits in (32, 64):
        fp = fpm.FixedPoint(bits=bits, scale=2.0**10, clip=4.0)
        values = np.array([-4.0, -1.5, 0.0, 0.25, 3.999, 10.0, -7.0])
        ring, clipped = fp.encode(values, np.zeros(len(values)))  # u = 0: always round up
        assert clipped == 2 and ring.dtype == fp.dtype
        np.testing.assert_allclose(fp.decode(ring), np.clip(values, -4, 4), atol=1 / fp.scale)
        # Sums of negative values wrap in the ring and decode to the right signed value.
        total = np.zeros(len(values), fp.dtype)
        for _ in range(5):
            total += ring
        np.testing.assert_allclose(fp.decode(total), 5 * fp.decode(ring))


def test_encoder_matches_the_pure_functions():
    rng = np.random.default_rng(3)
    fp = fpm.FixedPoint(bits=32, scale=2.0**12, clip=1.0)
    values, uniform = rng.normal(0, 0.8, 3000), rng.random(3000)
    clipped, n_clipped = fpm.clip_values(values, fp.clip)
    expected = fpm.to_ring(fpm.stochastic_round(clipped * fp.scale, uniform), 32)
    ring, count = fp.encode(values, uniform)
    np.testing.assert_array_equal(ring, expected)
    assert count == n_clipped == int(np.sum(np.abs(values) > 1))
    np.testing.assert_array_equal(
        fpm.from_ring(ring, 32), fpm.stochastic_round(clipped * fp.scale, uniform)
    )


def test_stochastic_rounding_is_unbiased_and_within_one_unit():
    rng = np.random.default_rng(2024)
    fp = fpm.FixedPoint(bits=32, scale=4.0, clip=10.0)
    x = np.full(200_000, 0.3)  # 1.2 units: deterministic rounding would give 1 unit, a bias of 0.05
    ring, _ = fp.encode(x, rng.random(x.size))
    decoded = fp.decode(ring)
    assert set(np.unique(decoded).tolist()) == {0.25, 0.5}
    assert np.all(np.abs(decoded - x) < 1 / fp.scale)
    standard_error = np.sqrt(0.2 * 0.8 / x.size) / fp.scale
    assert abs(decoded.mean() - 0.3) < 5 * standard_error


def test_decoded_sum_respects_the_documented_bound():
    rng = np.random.default_rng(7)
    fp = fpm.FixedPoint(bits=32, scale=2.0**8, clip=2.0)
    n, d = 50, 400
    x = rng.uniform(-3, 3, (n, d))
    total = np.zeros(d, fp.dtype)
    for row in x:
        ring, _ = fp.encode(row, rng.random(d))
        total += ring
    error = np.abs(fp.decode(total) - np.clip(x, -2, 2).sum(0))
    assert error.max() < fp.error_bound(n) == n / fp.scale
    # No sum of n encoded values leaves [-n L, n L]; clipped extremes reach it.
    extremes = sum(fp.encode(np.array([9.0, -9.0]), np.zeros(2))[0] for _ in range(n))
    assert fpm.from_ring(extremes, 32).tolist() == [fp.sum_bound(n), -fp.sum_bound(n)]
    assert np.abs(fpm.from_ring(total, 32)).max() <= fp.sum_bound(n) == n * fp.level


def test_fixed_point_refuses_nan_overflow_and_bad_parameters():
    fp = fpm.FixedPoint(bits=32, scale=2.0**16, clip=1.0)
    with pytest.raises(ValueError, match="NaN"):
        fp.encode(np.array([0.0, np.nan]), np.zeros(2))
    with pytest.raises(ValueError, match="NaN"):
        fp.encode(np.array([np.inf]), np.zeros(1))
    assert fp.max_clients == (2**31 - 1) // 2**16
    fp.check_clients(fp.max_clients)
    with pytest.raises(fpm.ModulusOverflowError, match="wrap"):
        fp.check_clients(fp.max_clients + 1)
    with pytest.raises(fpm.ModulusOverflowError):
        fpm.FixedPoint(bits=32, scale=2.0**30, clip=2.0)
    for kwargs in ({"bits": 16}, {"scale": 0.0}, {"clip": float("inf")}):
        with pytest.raises(ValueError):
            fpm.FixedPoint(**kwargs)
    assert issubclass(fpm.ModulusOverflowError, AggregationError)
    assert issubclass(fpm.ModulusOverflowError, ValueError)


def test_hkdf_is_rfc_5869_and_the_bytes_of_cryptographys_hkdf():
    """``cryptography``'s HKDF is RFC 5869 (test case 1), and the stdlib-HMAC one is its bytes."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    ikm, salt = bytes([0x0B]) * 22, bytes(range(13))
    info = bytes(range(0xF0, 0xFA))
    rfc = HKDF(algorithm=hashes.SHA256(), length=42, salt=salt, info=info).derive(ikm)
    assert rfc.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )
    rng = np.random.default_rng(0)
    for length in (1, 32, 33, 64, 100):
        secret = rng.bytes(32)
        info = rng.bytes(int(rng.integers(0, 80)))
        reference = HKDF(
            algorithm=hashes.SHA256(), length=length, salt=kx.PROTOCOL_LABEL, info=info
        ).derive(secret)
        assert kx.derive_key(secret, info, length=length) == reference
    with pytest.raises(ValueError, match="HKDF-SHA256 gives"):
        kx.derive_key(bytes(32), b"", length=0)


def test_mac_tags_verify_only_under_their_key_and_message():
    key, message = bytes(range(32)), b"survivor set"
    tag = kx.mac(key, message)
    assert len(tag) == kx.MAC_BYTES and kx.check_mac(key, message, tag)
    assert not kx.check_mac(bytes(32), message, tag)
    assert not kx.check_mac(key, message + b"!", tag)
    assert not kx.check_mac(key, message, tag[:-1]) and not kx.check_mac(key, message, b"")
    import hmac as stdlib_hmac

    cached = kx.MacKey(key)
    assert cached.tag(message) == tag == stdlib_hmac.new(key, message, "sha256").digest()
    assert cached.check(message, tag) and not cached.check(message + b"!", tag)
    assert not kx.MacKey(bytes(32)).check(message, tag)
