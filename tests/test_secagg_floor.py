"""Secure aggregation at its floor (issue 32): the faster paths give the same bytes.

The ConsistencyCheck messages bind the survivor set through a digest computed once per set
(:class:`~securefed.transport.secagg.signatures.SurvivorDigest`); these tests pin the bytes to
the pre-issue-32 construction, copied here, and check the digest is not recomputed per message.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import fixed_point as fpm
from securefed.crypto import keys as kx
from securefed.crypto import prg
from securefed.errors import InsecureParameterError
from securefed.transport.secagg import SecAggConfig, SecAggTransport, signatures

REGISTRY = hashlib.sha256(b"registry").digest()


def _old_digest(survivors) -> tuple[int, bytes]:
    """The survivor digest as securefed computed it before issue 32 (an ``lru_cache`` body)."""
    ids = sorted(int(c) for c in frozenset(int(c) for c in survivors))
    return len(ids), hashlib.sha256(struct.pack(f">{len(ids)}q", *ids)).digest()


def _old_tag_message(round_id, sender, recipient, survivors, *, registry, min_contributors=0):
    size, digest = _old_digest(survivors)
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            signatures.PURPOSE_CONSISTENCY_MAC,
            bytes(registry),
            struct.pack(">qqqqq", round_id, sender, recipient, size, min_contributors),
            digest,
        )
    )


def _old_message(round_id, survivors, *, registry, min_contributors=0):
    size, digest = _old_digest(survivors)
    return b"".join(
        (
            kx.PROTOCOL_LABEL,
            signatures.PURPOSE_CONSISTENCY,
            bytes(registry),
            struct.pack(">qqq", round_id, size, min_contributors),
            digest,
        )
    )


def _survivor_sets():
    rng = np.random.default_rng(32)
    big = rng.choice(10**6, size=1000, replace=False)
    return [
        frozenset(),
        frozenset({7}),
        frozenset(int(c) for c in big),
        {int(c) for c in big[:300]},  # a plain set
        [int(c) for c in big[:50]] * 2,  # a list with repeats: the set it names
    ]


@pytest.mark.parametrize("case", range(5))
def test_consistency_messages_are_byte_identical_to_the_old_construction(case):
    survivors = _survivor_sets()[case]
    for minimum in (0, 17):
        old_tag = _old_tag_message(
            3, 11, 12, survivors, registry=REGISTRY, min_contributors=minimum
        )
        old = _old_message(3, survivors, registry=REGISTRY, min_contributors=minimum)
        bound = signatures.survivor_digest(survivors)
        for given in (survivors, bound):
            assert (
                signatures.consistency_tag_message(
                    3, 11, 12, given, registry=REGISTRY, min_contributors=minimum
                )
                == old_tag
            )
            assert (
                signatures.consistency_message(
                    3, given, registry=REGISTRY, min_contributors=minimum
                )
                == old
            )


def _count_digests(monkeypatch) -> list[int]:
    """The sizes of the sets :func:`signatures.survivor_digest` hashes from now on."""
    calls = []
    original = signatures.survivor_digest

    def counted(survivors):
        calls.append(len(survivors))
        return original(survivors)

    monkeypatch.setattr(signatures, "survivor_digest", counted)
    return calls


def test_the_digest_is_computed_once_per_set_not_per_message(monkeypatch):
    calls = _count_digests(monkeypatch)
    survivors = frozenset(range(1000, 2000))
    tags = {
        signatures.consistency_tag_message(0, u, v, survivors, registry=REGISTRY)
        for u in range(40)
        for v in range(40)
    }
    assert len(tags) == 1600  # one message per (sender, recipient)
    assert calls == [1000]
    # An equal set in another object is hashed again (identity, never a 1000-element ==), and
    # binds the same bytes.
    twin = frozenset(range(1000, 2000))
    assert signatures.consistency_tag_message(0, 1, 2, twin, registry=REGISTRY) == _old_tag_message(
        0, 1, 2, survivors, registry=REGISTRY
    )
    assert calls == [1000, 1000]


def test_many_sets_in_turn_each_bind_their_own_digest():
    """More sets than the memo holds, interleaved: every message still binds its own set."""
    sets = [frozenset(range(i, i + 100)) for i in range(3 * signatures._RECENT_LIMIT)]
    for _ in range(2):
        for s in sets:
            assert signatures.consistency_tag_message(
                1, 2, 3, s, registry=REGISTRY
            ) == _old_tag_message(1, 2, 3, s, registry=REGISTRY)
    assert len(signatures._RECENT_DIGESTS) <= signatures._RECENT_LIMIT


@pytest.mark.parametrize("auth", ["signatures", "macs"])
def test_a_malicious_round_hashes_its_survivor_set_once(monkeypatch, auth):
    """Some 12 x 11 ConsistencyCheck messages over one set: one digest (the helpers share the
    server's frozenset), and the round's sum is the plaintext one (inputs on the 1/64 grid)."""
    calls = _count_digests(monkeypatch)
    values = (np.arange(12 * 4).reshape(12, 4) % 64) / 64 - 0.5
    transport = SecAggTransport(SecAggConfig(neighbours=11, auth=auth))
    rnd = transport.open_round(0, range(12), shape=(1, 4), seeds=SeedTree(3))
    for c in range(12):
        rnd.submit(c, values[c])
    np.testing.assert_array_equal(rnd.result().total, values.sum(axis=0, keepdims=True))
    assert calls == [12]


def _old_encoder_ring(fp, values: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """:meth:`Encoder.encode`'s ring as computed before issue 32 (the bit added in floats)."""
    z = np.clip(values, -fp.clip, fp.clip) * fp.scale
    floor = np.floor(z)
    floor = floor + (uniform < z - floor)
    signed = floor.astype(np.int32 if fp.bits == 32 else np.int64)
    return signed.view(np.uint32 if fp.bits == 32 else np.uint64)


@pytest.mark.parametrize("bits", [32, 64])
def test_the_encoder_gives_the_old_ring_elements_bit_for_bit(bits):
    fp = fpm.FixedPoint(bits=bits, scale=2.0**20, clip=2.0)
    rng = np.random.default_rng(bits)
    values = np.concatenate(
        [
            rng.uniform(-2, 2, 5000),
            [-2.0, 2.0, 0.0, -0.0, 2**-40, -(2**-40), 1 - 2**-53, -1 + 2**-53],
            rng.uniform(-5, 5, 500),  # some clipped
        ]
    )
    uniform = prg.uniform_floats(bytes(range(32)), len(values))
    uniform[:8] = [0.0, 1 - 2**-53, 0.5, 0.0, 0.0, 1 - 2**-53, 0.25, 0.75]
    ring, n_clipped = fpm.Encoder(fp, len(values)).encode(values, uniform)
    np.testing.assert_array_equal(ring, _old_encoder_ring(fp, values, uniform))
    clipped, count = fpm.clip_values(values, fp.clip)
    reference = fpm.to_ring(fpm.stochastic_round(clipped * fp.scale, uniform), bits)
    np.testing.assert_array_equal(ring, reference)
    assert n_clipped == count > 0 and ring.dtype == fp.dtype


def _seeded_round_uploads(values: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Each client's masked-upload SHA-256 (as the server's view keeps it) and the ring sum of
    one seeded malicious-server round with clipping."""
    config = SecAggConfig(neighbours=7, out_of_range="clip")
    transport = SecAggTransport(config, keep_payloads=ALL_PAYLOADS)
    rnd = transport.open_round(0, range(len(values)), shape=(1, values.shape[1]), seeds=SeedTree(5))
    rnd.drop(len(values) - 1)
    for c in range(len(values) - 1):
        rnd.submit(c, values[c])
    rnd.result()
    uploads = [bytes(rnd.view.payloads[c]["masked_sha256"]) for c in range(len(values) - 1)]
    return uploads, np.array(rnd.view.aggregate["ring_sum"])


def test_a_seeded_round_uploads_the_same_masked_vectors_as_with_the_old_encoder(monkeypatch):
    """The masked uploads and the ring sum, bit for bit, against the same round encoded by the
    old formula (patched in for a second run in this test)."""
    values = np.random.default_rng(9).uniform(-1.5, 1.5, size=(9, 300))
    new_uploads, new_sum = _seeded_round_uploads(values)

    def old_encode(self, vals, uniform, *, bounds=None):  # the bounds ignored: recomputed
        z = np.clip(vals, -self.fixed_point.clip, self.fixed_point.clip)
        ring = _old_encoder_ring(self.fixed_point, vals, uniform)
        return ring.astype(self.fixed_point.dtype, copy=False), int(np.count_nonzero(z != vals))

    monkeypatch.setattr(fpm.Encoder, "encode", old_encode)
    old_uploads, old_sum = _seeded_round_uploads(values)
    assert new_uploads == old_uploads and len(set(new_uploads)) == len(new_uploads)
    np.testing.assert_array_equal(new_sum, old_sum)


def test_a_malformed_survivor_digest_is_refused():
    with pytest.raises(ValueError, match="32-byte SHA-256"):
        signatures.SurvivorDigest(3, b"short")
    with pytest.raises(ValueError, match="size >= 0"):
        signatures.SurvivorDigest(-1, bytes(32))


# -- the encoding's fused pass (issue 32 item 1: encoding at its floor) ------------------------
KEY = bytes(range(32))


@pytest.mark.parametrize("length", [0, 1, 7, 1000, 4097])
@pytest.mark.parametrize("block", [1, 16, 1024, 10_000])
def test_uniform_blocks_continue_one_keystream_into_the_same_floats(length, block):
    source = prg.UniformSource(length)
    blocks = [b.copy() for b in source.blocks(KEY, block)]
    assert all(len(b) == min(block, length) for b in blocks[:-1])
    joined = np.concatenate(blocks) if blocks else np.empty(0)
    np.testing.assert_array_equal(joined, prg.uniform_floats(KEY, length))
    np.testing.assert_array_equal(joined, prg.UniformSource(length).draw(KEY))


def test_uniform_blocks_refuse_an_empty_block():
    with pytest.raises(ValueError, match="block must be >= 1"):
        next(prg.UniformSource(10).blocks(KEY, 0))


def _edge_values(rng, clip, length):
    """Values in the clip range, with its ends, signed zeros and fractions near 0 and 1."""
    edges = [-clip, clip, 0.0, -0.0, 2**-40, -(2**-40), 1 - 2**-53, -1 + 2**-53, 2**-1074]
    return np.concatenate([edges, rng.uniform(-clip, clip, length - len(edges))])


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("block", [1, 333, 4096, 10**6])
def test_the_blocked_encoding_gives_the_old_ring_elements_bit_for_bit(bits, block):
    """Against the pre-issue-32 formula on the whole vector: in range (the fused pass) and with
    values to clip (the gathered fall-back), the draw given in blocks of every size."""
    fp = fpm.FixedPoint(bits=bits, scale=2.0**20, clip=2.0)
    rng = np.random.default_rng(bits + block)
    in_range = _edge_values(rng, fp.clip, 5000)
    clipped = np.concatenate([in_range, rng.uniform(-5, 5, 500)])
    for values in (in_range, clipped):
        source = prg.UniformSource(len(values))
        uniform = prg.uniform_floats(KEY, len(values))
        ring, n_clipped = fpm.Encoder(fp, len(values)).encode_blocks(
            values, source.blocks(KEY, block)
        )
        np.testing.assert_array_equal(ring, _old_encoder_ring(fp, values, uniform))
        assert ring.dtype == fp.dtype
        assert n_clipped == int(np.count_nonzero(np.abs(values) > fp.clip))
    assert n_clipped > 0


def test_the_blocked_encoding_refuses_what_the_encoder_refuses():
    fp = fpm.FixedPoint(bits=32, scale=2.0**10, clip=1.0)
    encoder = fpm.Encoder(fp, 4)
    with pytest.raises(ValueError, match="NaN or infinite"):
        encoder.encode_blocks(np.array([0.0, np.nan, 0.0, 0.0]), [np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match="hold 3 values, expected 4"):
        encoder.encode_blocks(np.zeros(4), [np.zeros(2), np.zeros(1)])
    with pytest.raises(ValueError, match="more than 4"):
        encoder.encode_blocks(np.zeros(4), [np.zeros(3), np.zeros(3)])
    with pytest.raises(ValueError, match="expected 4 values"):
        encoder.encode_blocks(np.zeros(5), [np.zeros(5)])


def _seeded_in_range_round(values: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Masked-upload digests and ring sum of a seeded honest-but-curious round, no clipping."""
    config = SecAggConfig(neighbours=7, server="honest_but_curious")
    transport = SecAggTransport(config, keep_payloads=ALL_PAYLOADS)
    rnd = transport.open_round(0, range(len(values)), shape=(1, values.shape[1]), seeds=SeedTree(8))
    for c in range(len(values)):
        rnd.submit(c, values[c])
    rnd.result()
    uploads = [bytes(rnd.view.payloads[c]["masked_sha256"]) for c in range(len(values))]
    return uploads, np.array(rnd.view.aggregate["ring_sum"])


def test_a_round_through_the_fused_encoding_uploads_what_the_old_path_uploaded(monkeypatch):
    """Bit for bit, the masked uploads and the ring sum of a seeded round whose values are all in
    range (the fused pass), against the same round with the old path patched in: the whole draw
    (``uniform_floats``) and the pre-issue-32 formula."""
    from securefed.transport.secagg import client as client_mod

    values = np.random.default_rng(4).uniform(-1, 1, size=(9, 40_000))
    new_uploads, new_sum = _seeded_in_range_round(values)

    def old_encode_input(vals, key, workspace, *, owner, bounds=None):
        fp = workspace.encoder.fixed_point
        uniform = prg.uniform_floats(key, len(vals), prg=workspace.uniform.prg)
        return _old_encoder_ring(fp, vals, uniform).astype(fp.dtype), 0

    monkeypatch.setattr(client_mod, "encode_input", old_encode_input)
    old_uploads, old_sum = _seeded_in_range_round(values)
    assert new_uploads == old_uploads and len(set(new_uploads)) == len(new_uploads)
    np.testing.assert_array_equal(new_sum, old_sum)


def test_mask_contexts_share_a_mode_per_domain_and_give_the_old_keystream():
    """The cached CTR mode changes no byte: masks against a context built the old way."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    expander = prg.MaskExpander(1000)
    for domain in (prg.DOMAIN_SELF_MASK, prg.DOMAIN_PAIR_MASK):
        old = Cipher(algorithms.AES(KEY), modes.CTR(domain + bytes(8))).encryptor()
        expected = np.frombuffer(old.update(bytes(4000)), "<u4")
        np.testing.assert_array_equal(expander.mask(KEY, domain=domain), expected)
    assert prg._ctr_mode(prg.DOMAIN_PAIR_MASK) is prg._ctr_mode(prg.DOMAIN_PAIR_MASK)


# -- pair keys across rounds: a graph kept for an epoch (issue 32 item 1) ----------------------
def _pairs_agreed(transport) -> int:
    return transport.signers.pairs_agreed


def _run_rounds(config, rounds, n=12, clients=None):
    """``rounds`` seeded rounds of ``n`` clients on one transport: each round's neighbours, the
    static pairwise keys agreed so far after each round, and each round's total."""
    transport = SecAggTransport(config)
    values = (np.arange(n * 3).reshape(n, 3) % 16) / 16 - 0.5
    graphs, agreed, totals = [], [], []
    for r in range(rounds):
        ids = list(range(n)) if clients is None else clients(r)
        rnd = transport.open_round(r, ids, shape=(1, 3), seeds=SeedTree(6))
        graphs.append({c: tuple(rnd.neighbours(c).tolist()) for c in ids})
        for c in ids:
            rnd.submit(c, values[c])
        totals.append(rnd.result().total)
        np.testing.assert_allclose(totals[-1], values[ids].sum(axis=0, keepdims=True), atol=1e-4)
        agreed.append(_pairs_agreed(transport))
    return graphs, agreed, totals


def test_a_graph_kept_for_an_epoch_agrees_no_new_pair_key_within_it():
    """With a fresh graph every round, each round meets new pairs and agrees their static keys
    again (the set-up recurs); with ``graph_epoch=3`` rounds 0-2 share round 0's graph (no new
    key after round 0) and round 3 draws a new one."""
    fresh = SecAggConfig(neighbours=4, auth="macs")
    kept = SecAggConfig(neighbours=4, auth="macs", graph_epoch=3)
    fresh_graphs, fresh_agreed, _ = _run_rounds(fresh, 4)
    kept_graphs, kept_agreed, _ = _run_rounds(kept, 4)
    assert fresh_graphs[0] == kept_graphs[0]  # the epoch's first round: the round's own graph
    assert len({tuple(sorted(g.items())) for g in fresh_graphs}) == 4
    assert fresh_agreed[1] > fresh_agreed[0]
    assert kept_graphs[0] == kept_graphs[1] == kept_graphs[2] != kept_graphs[3]
    assert kept_agreed[0] == kept_agreed[1] == kept_agreed[2] < kept_agreed[3]
    assert kept_agreed[2] < fresh_agreed[2]


def test_another_cohort_in_the_same_epoch_gets_its_own_graph():
    """The seed binds the clients: a round of other clients inside the epoch draws afresh."""
    kept = SecAggConfig(neighbours=4, auth="macs", graph_epoch=10)
    graphs, _, _ = _run_rounds(
        kept, 2, clients=lambda r: list(range(12)) if r == 0 else list(range(1, 13)), n=13
    )
    assert graphs[0] != {c: graphs[1].get(c) for c in graphs[0]}


def test_a_kept_graph_is_recorded_and_the_default_records_as_before():
    kept = SecAggTransport(SecAggConfig(neighbours=4, auth="macs", graph_epoch=5))
    rnd = kept.open_round(7, range(8), shape=(1, 2), seeds=SeedTree(1))
    assert rnd.view.public["secagg_graph_round"] == 5
    assert kept.public_parameters()["graph_epoch"] == 5
    fresh = SecAggTransport(SecAggConfig(neighbours=4)).open_round(
        7, range(8), shape=(1, 2), seeds=SeedTree(1)
    )
    assert "secagg_graph_round" not in fresh.view.public


def test_a_kept_graph_is_refused_where_no_pair_key_is_kept():
    with pytest.raises(InsecureParameterError, match="applies only to server='malicious'"):
        SecAggConfig(graph_epoch=2, server="honest_but_curious")
    # With signatures (the default) a kept graph runs signed epoch sessions
    # (tests/test_secagg_epoch_signed.py).
    assert SecAggConfig(graph_epoch=2).epoch_signed
    assert not SecAggConfig(graph_epoch=2, auth="macs").epoch_signed


@pytest.mark.parametrize("epoch", [0, -1, 1.5, True, "2"])
def test_a_malformed_graph_epoch_is_refused(epoch):
    with pytest.raises(ValueError, match="graph_epoch must be"):
        SecAggConfig(auth="macs", graph_epoch=epoch)


def test_the_multi_round_bench_keeps_one_graph_and_pays_the_set_up_once():
    """``bench secagg-malicious --rounds``: one seed tree for the run, so the kept graph is one
    graph and only its first round agrees pair keys; the fresh graph changes every round."""
    from securefed.bench.bench_secagg import epoch_table, run_epoch_cost

    report = run_epoch_cost(12, 50, 3)
    kept = report["variants"]["malicious_macs_graph_kept"]
    fresh = report["variants"]["malicious_macs_fresh_graph"]
    assert kept["distinct_graphs"] == 1 and fresh["distinct_graphs"] == 3
    assert kept["rounds"][0]["setup_seconds"] > 0
    agreed = [row["pairs_agreed"] for row in kept["rounds"]]
    assert agreed[0] == 12 * kept["rounds"][0]["k"] and agreed[0] == agreed[1] == agreed[2]
    fresh_agreed = [row["pairs_agreed"] for row in fresh["rounds"]]
    assert fresh_agreed[0] == agreed[0] < fresh_agreed[1] < fresh_agreed[2]
    assert report["variants"]["honest_but_curious"]["over_hbc_total"] == 1.0
    assert "graph kept (graph_epoch=3)" in epoch_table(report)
    signed = report["variants"]["malicious_signatures_epoch"]
    assert signed["distinct_graphs"] == 1
    # One signed epoch session per client for the run; the default signs every round.
    assert [row["epoch_sessions"] for row in signed["rounds"]] == [12, 12, 12]
    default = report["variants"]["malicious_signatures_fresh_graph"]
    assert default["distinct_graphs"] == 3 and default["rounds"][2]["epoch_sessions"] == 0
    assert "signed epoch session (graph_epoch=3)" in epoch_table(report)
