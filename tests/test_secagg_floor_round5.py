"""Secure aggregation at its floor, round five (issue 32): the pair keys agreed in one loop.

``kx.pair_keys`` agrees a client's keys with all its neighbours in one loop (one X25519 exchange
and one HKDF each, as ``kx.pair_key``), and a client agrees every pairwise seed before it expands
any mask (main at 67ffd57 agreed and expanded one neighbour at a time, reading the stage timer
twice per neighbour). Checked here: the same keys as ``pair_key`` and the same refusals, naming
the peer; and a seeded round's every payload (sealed shares, masked uploads, revealed secrets)
and ring sum, bit for bit, against the same round through main's per-pair paths, for 32- and
64-bit rings, both threat models, random inputs, dropouts before and after masking.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import keys as kx
from securefed.crypto import prg
from securefed.transport.secagg import SecAggConfig, SecAggTransport
from securefed.transport.secagg import client as client_mod

N_CLIENTS, LENGTH = 14, 1500
LOW_ORDER = bytes(32)  # u = 0: a point of small order (the shared secret is all zeros)
NON_CANONICAL = (kx.CURVE25519_PRIME + 1).to_bytes(32, "little")


def _keypairs(count: int, seed: int) -> list[kx.KeyPair]:
    rng = np.random.default_rng(seed)
    return [kx.keypair_from_seed(rng.bytes(32)) for _ in range(count)]


def _per_pair(private, publics, purpose, round_id, me, peers):
    """main's path: one ``pair_key`` call per peer."""
    return [
        kx.pair_key(private, public, purpose, round_id, me, peer)
        for public, peer in zip(publics, peers, strict=True)
    ]


@pytest.mark.parametrize("purpose", [kx.PURPOSE_PAIR_MASK, kx.PURPOSE_SHARE_KEY])
def test_pair_keys_are_pair_key_for_every_peer(purpose):
    """Random keys, peers on both sides of ``me`` (the unordered pair), big round and client ids,
    numpy integers and bytes-like public keys."""
    rng = np.random.default_rng(5)
    pairs = _keypairs(30, 1)
    me_pair, others = pairs[0], pairs[1:]
    for round_id, me in [(0, 0), (7, 500), (2**40, 2**50)]:
        peers = rng.choice(2**31, len(others), replace=False).tolist()
        peers[:3] = [me + 1, max(me - 1, 0) if me else 2, 2**62]
        publics = [p.public for p in others]
        expected = _per_pair(me_pair.private, publics, purpose, round_id, me, peers)
        assert kx.pair_keys(me_pair.private, publics, purpose, round_id, me, peers) == expected
        mixed = [bytearray(p) if i % 3 == 0 else memoryview(p) for i, p in enumerate(publics)]
        got = kx.pair_keys(
            me_pair.private, mixed, purpose, np.int64(round_id), np.int64(me), np.array(peers)
        )
        assert got == expected
    assert kx.pair_keys(me_pair.private, [], purpose, 0, 0, []) == []


def test_pair_keys_are_symmetric():
    a, b = _keypairs(2, 2)
    ab = kx.pair_keys(a.private, [b.public], kx.PURPOSE_PAIR_MASK, 3, 10, [4])
    ba = kx.pair_keys(b.private, [a.public], kx.PURPOSE_PAIR_MASK, 3, 4, [10])
    assert ab == ba == [kx.pair_key(a.private, b.public, kx.PURPOSE_PAIR_MASK, 3, 10, 4)]


@pytest.mark.parametrize(
    ("bad", "what"),
    [(LOW_ORDER, "low-order"), (NON_CANONICAL, "not canonical"), (b"\x09" * 31, "32 bytes")],
)
def test_pair_keys_refuse_a_bad_key_as_agree_does_naming_its_peer(bad, what):
    """The first bad key refuses, with agree's error naming that peer (not a later one)."""
    pairs = _keypairs(5, 3)
    publics = [p.public for p in pairs[1:]]
    publics[2] = bad
    peers = [11, 12, 13, 14]
    with pytest.raises(kx.InvalidPublicKeyError, match=f"client 13's X25519 .*{what}") as got:
        kx.pair_keys(pairs[0].private, publics, kx.PURPOSE_PAIR_MASK, 0, 10, peers)
    with pytest.raises(kx.InvalidPublicKeyError) as old:
        _per_pair(pairs[0].private, publics, kx.PURPOSE_PAIR_MASK, 0, 10, peers)
    assert str(got.value) == str(old.value)


def test_pair_keys_refuse_peers_and_keys_of_different_lengths():
    pairs = _keypairs(3, 4)
    with pytest.raises(ValueError):
        kx.pair_keys(pairs[0].private, [p.public for p in pairs[1:]], b"p", 0, 0, [1])


def test_a_client_refuses_a_bad_neighbour_key_before_any_pairwise_mask(monkeypatch):
    """A low-order ``s`` key among a client's neighbours: masking refuses, naming that
    neighbour, before any pairwise mask is expanded (the seeds are agreed first)."""
    config = SecAggConfig(server="honest_but_curious", neighbours=6)
    rnd = SecAggTransport(config).open_round(0, range(8), shape=(1, 50), seeds=SeedTree(3))
    request = rnd.mask_request(0)
    publics = list(request.s_publics)
    publics[1] = LOW_ORDER
    expanded = []
    original = prg.MaskExpander.add

    def counting(self, acc, key, *, domain, sign=1):
        expanded.append(domain)
        return original(self, acc, key, domain=domain, sign=sign)

    monkeypatch.setattr(prg.MaskExpander, "add", counting)
    workspace = client_mod.masking_workspace(50, rnd.config)
    client = rnd._clients[0]
    with pytest.raises(kx.InvalidPublicKeyError, match=f"client {request.neighbours[1]}'s"):
        client.mask(np.zeros(50), request.neighbours, publics, workspace)
    assert prg.DOMAIN_PAIR_MASK not in expanded
    assert client.stage == "share"  # it did not mask: nothing left the client


def _main_add_masks(self, masked, neighbours, s_publics, workspace, timer, start):
    """main's ``SecAggClient._add_masks`` (67ffd57): agree and expand one neighbour at a time."""
    expander = workspace.expander
    expander.add(masked, self.b, domain=prg.DOMAIN_SELF_MASK)
    start = timer.add("mask_expansion", start)
    for v, public in zip(neighbours, s_publics, strict=True):
        seed = kx.pair_key(self.s.private, public, kx.PURPOSE_PAIR_MASK, self.round_id, self.id, v)
        start = timer.add("key_agreement", start)
        expander.add(masked, seed, domain=prg.DOMAIN_PAIR_MASK, sign=1 if v > self.id else -1)
        start = timer.add("mask_expansion", start)
    self.stage = "mask"


def _patch_main_paths(monkeypatch) -> None:
    monkeypatch.setattr(kx, "pair_keys", _per_pair)  # share() and the server's unmasking
    monkeypatch.setattr(client_mod.SecAggClient, "_add_masks", _main_add_masks)


VARIANTS = [
    {"server": "honest_but_curious"},
    {"server": "malicious", "auth": "macs"},
    {"server": "malicious", "auth": "signatures"},
]


def _round_bytes(variant: dict, bits: int, seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """Every payload the view keeps (SHA-256 per client and field; the masked uploads
    themselves), the ring sum and the decoded total of one seeded round on random inputs: two
    clients drop before masking (their pairwise masks are removed by the server), one after."""
    config = SecAggConfig(neighbours=7, bits=bits, out_of_range="clip", **variant)
    transport = SecAggTransport(config, keep_payloads=ALL_PAYLOADS, keep_masked=True)
    rng = np.random.default_rng(seed)
    values = rng.uniform(-1.2, 1.2, (N_CLIENTS, LENGTH))
    before = rng.choice(N_CLIENTS, 2, replace=False).tolist()
    after = rng.choice(sorted(set(range(N_CLIENTS)) - set(before)))
    rnd = transport.open_round(seed, range(N_CLIENTS), shape=(1, LENGTH), seeds=SeedTree(seed))
    for c in before:
        rnd.drop(c)
    for c in range(N_CLIENTS):
        if c not in before:
            rnd.submit(c, values[c])
    rnd.drop(int(after))
    total = rnd.result().total
    payloads = {
        (c, name): hashlib.sha256(np.ascontiguousarray(field).tobytes()).hexdigest()
        for c, fields in rnd.view.payloads.items()
        for name, field in fields.items()
    }
    return payloads, np.array(rnd.view.aggregate["ring_sum"]), total


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_a_round_gives_the_bytes_and_the_sum_of_mains_per_pair_paths(monkeypatch, variant, bits):
    for seed in (1, 2):
        new_payloads, new_sum, new_total = _round_bytes(variant, bits, seed)
        with monkeypatch.context() as patched:
            _patch_main_paths(patched)
            old_payloads, old_sum, old_total = _round_bytes(variant, bits, seed)
        assert new_payloads == old_payloads
        kinds = {name for _, name in new_payloads}
        assert {"masked", "shares_sent", "revealed_self_seed", "revealed_mask_key"} <= kinds
        assert new_sum.dtype == np.dtype(f"uint{bits}")
        np.testing.assert_array_equal(new_sum, old_sum)
        np.testing.assert_array_equal(new_total, old_total)


def test_the_comparison_sees_other_pair_keys(monkeypatch):
    """The equality above is not vacuous: per-pair keys bound to another round (still symmetric,
    so the masks cancel and the sum is the same) give other sealed shares and masked uploads."""
    new_payloads, new_sum, _ = _round_bytes(VARIANTS[0], 32, 1)

    def other_round(private, publics, purpose, round_id, me, peers):
        return _per_pair(private, publics, purpose, round_id + 1, me, peers)

    monkeypatch.setattr(kx, "pair_keys", other_round)
    old_payloads, old_sum, _ = _round_bytes(VARIANTS[0], 32, 1)
    differ = {key[1] for key in new_payloads if new_payloads[key] != old_payloads[key]}
    assert {"masked", "shares_sent"} <= differ
    np.testing.assert_array_equal(old_sum, new_sum)


def test_the_raw_encodings_are_the_serialization_apis_bytes():
    """``public_bytes_raw`` / ``private_bytes_raw`` (used now) against main's
    ``public_bytes(Raw, Raw)`` / ``private_bytes(Raw, Raw, NoEncryption())``."""
    from cryptography.hazmat.primitives import serialization as ser

    for pair in [*_keypairs(20, 6), kx.generate_keypair()]:
        assert pair.public == pair.private.public_key().public_bytes(
            ser.Encoding.Raw, ser.PublicFormat.Raw
        )
        assert pair.private_bytes() == pair.private.private_bytes(
            ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption()
        )
    seed = bytes(range(32))
    assert kx.keypair_from_seed(seed).private_bytes() == seed
