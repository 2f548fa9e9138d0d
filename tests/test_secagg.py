"""Tests of the secure-aggregation transport (SecAgg / SecAgg+), with the real cryptography."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from securefed import ALL_PAYLOADS, PlaintextTransport, RowUpdates, SeedTree, ServerView
from securefed.crypto import prg
from securefed.crypto.fixed_point import ModulusOverflowError
from securefed.crypto.keys import ShareDecryptionError
from securefed.errors import AggregationError, InsecureParameterError
from securefed.transport import secagg
from securefed.transport.secagg import SecAggConfig, SecAggTransport


def _open(n, d, *, config=None, seed=0, round_id=0, keep=ALL_PAYLOADS, transport=None):
    transport = transport or SecAggTransport(config, keep_payloads=keep, keep_masked=True)
    rnd = transport.open_round(round_id, range(n), shape=(1, d), seeds=SeedTree(seed))
    return transport, rnd


def _check_close(aggregate_total, expected, bound):
    error = np.max(np.abs(np.asarray(aggregate_total).ravel() - np.asarray(expected).ravel()))
    assert error < bound + 1e-9, f"error {error} exceeds the bound {bound}"


# ----------------------------------------------------------------------------- correctness
def test_sum_matches_plaintext_within_the_bound():
    n, shape = 12, (3, 4)
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.9, 0.9, (n, shape[0] * shape[1]))
    seeds = SeedTree(1)
    secure = SecAggTransport(SecAggConfig(neighbours=6))
    plain = PlaintextTransport()
    rounds = [t.open_round(0, range(n), shape=shape, seeds=seeds) for t in (secure, plain)]
    for rnd in rounds:
        for c in range(n):
            rnd.submit(c, x[c])
    ours, reference = (r.result() for r in rounds)
    assert ours.total.shape == shape
    _check_close(ours.total, reference.total, rounds[0].error_bound())
    assert ours.weight == reference.weight == n
    np.testing.assert_array_equal(ours.contributors, np.arange(n))
    scale = rounds[0].fixed_point.scale  # the automatic scale for 12 clients: 2^27
    assert scale == 2.0**27 and rounds[0].error_bound() == n / scale


def test_weighted_sum_is_applied_client_side():
    n, d = 9, 7
    rng = np.random.default_rng(1)
    x, w = rng.uniform(-1, 1, (n, d)), rng.uniform(0, 1, n)
    _, rnd = _open(n, d)
    for c in range(n):
        rnd.submit(c, x[c], weight=w[c])
    aggregate = rnd.result()
    _check_close(aggregate.total, (w[:, None] * x).sum(0), rnd.error_bound())
    assert abs(aggregate.weight - w.sum()) < rnd.error_bound()
    # The weight travels masked: one extra ring element per client.
    assert rnd.view.payload(0)["masked"].shape == (d + 1,)


def test_sparse_batches_are_densified():
    n, shape = 6, (5, 2)
    rng = np.random.default_rng(2)
    updates = RowUpdates(
        clients=np.arange(n),
        indptr=np.array([0, 1, 3, 3, 4, 6, 7]),
        rows=np.array([0, 1, 4, 2, 0, 3, 4]),
        values=rng.uniform(-1, 1, (7, 2)),
        n_rows=shape[0],
    )
    rnd = SecAggTransport().open_round(0, range(n), shape=shape, seeds=SeedTree(0))
    rnd.submit_batch(updates)
    _check_close(rnd.result().total, updates.weighted_sum(), rnd.error_bound())


def test_clipping_is_counted_when_asked_for():
    _, rnd = _open(4, 5, config=SecAggConfig(clip=1.0, out_of_range="clip"))
    rnd.submit(0, np.array([2.0, -3.0, 0.5, 0.0, 1.0]))
    for c in (1, 2, 3):
        rnd.submit(c, np.zeros(5))
    assert rnd.clipped == {0: 2, 1: 0, 2: 0, 3: 0}
    _check_close(rnd.result().total, [1.0, -1.0, 0.5, 0.0, 1.0], rnd.error_bound())
    assert rnd.view.public["secagg_values_clipped"] == 2


def test_values_out_of_the_clip_range_are_refused_by_default():
    # Issue 17 item 10's exploit: three clients sending 3.0 summed to 3.0, silently clipped.
    _, rnd = _open(3, 1, config=SecAggConfig(clip=1.0))
    with pytest.raises(ValueError, match=r"client 0's update has 1 value\(s\) outside"):
        rnd.submit(0, np.array([3.0]))
    with pytest.raises(AggregationError):  # the round stays refused, nothing half-summed
        rnd.submit(1, np.array([0.5]))


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize(
    ("prg_name", "aead"), [("aes-256-ctr", "aes-256-gcm"), ("chacha20", "chacha20-poly1305")]
)
def test_ring_sizes_and_primitives(bits, prg_name, aead):
    config = SecAggConfig(
        bits=bits, scale=2.0**30 if bits == 64 else 2.0**16, prg=prg_name, aead=aead
    )
    n, d = 7, 11
    x = np.random.default_rng(3).uniform(-1, 1, (n, d))
    _, rnd = _open(n, d, config=config)
    for c in range(n):
        rnd.submit(c, x[c])
    rnd.drop(2)  # after submitting: still counted
    _check_close(rnd.result().total, x.sum(0), rnd.error_bound())
    assert rnd.view.payload(0)["masked"].dtype == np.dtype(f"<u{bits // 8}")


def test_complete_graph_is_bonawitz():
    n, d = 8, 5
    config = SecAggConfig(neighbours=100)
    _, rnd = _open(n, d, config=config)
    assert rnd.neighbours_k == n - 1 and rnd.threshold == n // 2
    for c in range(n):
        assert sorted(rnd.neighbours(c).tolist()) == [v for v in range(n) if v != c]
    x = np.random.default_rng(4).uniform(-1, 1, (n, d))
    rnd.drop(0)  # before submitting: no contribution, its pairwise masks removed
    for c in range(1, n):
        rnd.submit(c, x[c])
    rnd.drop(5)  # after submitting: counted, its self mask rebuilt from others' shares
    aggregate = rnd.result()
    _check_close(aggregate.total, x[1:].sum(0), rnd.error_bound())
    assert aggregate.contributors.tolist() == list(range(1, n))


def test_drop_after_submit_still_counted_and_before_submit_not():
    n, d = 10, 4
    x = np.random.default_rng(5).uniform(-1, 1, (n, d))
    _, rnd = _open(n, d)
    for c in range(n):
        if c == 3:
            rnd.drop(c)
            continue
        rnd.submit(c, x[c])
    rnd.drop(7)
    aggregate = rnd.result()
    _check_close(aggregate.total, np.delete(x, 3, axis=0).sum(0), rnd.error_bound())
    assert 7 in aggregate.contributors and 3 not in aggregate.contributors
    # The server rebuilt client 7's self-mask seed and client 3's mask key, nothing else of them.
    assert "revealed_self_seed" in rnd.view.payload(7)
    assert "revealed_mask_key" in rnd.view.payload(3)
    assert "revealed_mask_key" not in rnd.view.payload(7)


def test_empty_round_and_single_client():
    transport = SecAggTransport()
    rnd = transport.open_round(0, [], shape=(1, 3), seeds=SeedTree(0))
    aggregate = rnd.result()
    assert aggregate.weight == 0 and not aggregate.total.any()
    with pytest.raises(AggregationError, match="at least 2"):
        transport.open_round(1, [4], shape=(1, 3), seeds=SeedTree(0))


def test_secure_mode_runs_and_seeded_mode_reproduces():
    n, d = 6, 50
    x = np.random.default_rng(6).uniform(-1, 1, (n, d))

    def masked(seeds):
        rnd = SecAggTransport(keep_payloads=ALL_PAYLOADS, keep_masked=True).open_round(
            0, range(n), shape=(1, d), seeds=seeds
        )
        for c in range(n):
            rnd.submit(c, x[c])
        _check_close(rnd.result().total, x.sum(0), rnd.error_bound())
        return rnd.view.payload(0)["masked"], rnd.view.payload(0)["c_public"]

    a, b = masked(SeedTree(9)), masked(SeedTree(9))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    s1, s2 = masked(SeedTree.secure_mode()), masked(SeedTree.secure_mode())
    assert not np.array_equal(s1[0], s2[0]) and not np.array_equal(s1[1], s2[1])


# ----------------------------------------------------------------------------- property tests
def _oracle_succeeds(rnd, n, submitted, dropped):
    """Independent statement of when unmasking must succeed (public graph, threshold)."""
    helpers = submitted - dropped
    for u in range(n):
        neighbours = set(rnd.neighbours(u).tolist())
        needed = u in submitted or neighbours & submitted
        if needed and len(neighbours & helpers) < rnd.threshold:
            return False
    if not submitted:
        return True
    start = min(submitted)
    seen, queue = {start}, deque([start])
    while queue:
        u = queue.popleft()
        for v in rnd.neighbours(u).tolist():
            if v in submitted and v not in seen:
                seen.add(v)
                queue.append(v)
    return seen == submitted


@settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_sum_or_refusal(data):
    n = data.draw(st.integers(2, 30), label="n")
    d = data.draw(st.integers(1, 12), label="d")
    neighbours = data.draw(st.one_of(st.none(), st.integers(2, n)), label="neighbours")
    k = secagg.effective_neighbours(n, neighbours)
    threshold = data.draw(st.one_of(st.none(), st.integers(k // 2 + 1, k)), label="threshold")
    status = data.draw(
        st.lists(
            st.sampled_from(["ok", "ok", "ok", "before", "after", "silent"]), min_size=n, max_size=n
        ),
        label="status",
    )
    weighted = data.draw(st.booleans(), label="weighted")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.2, 1.2, (n, d))  # some values outside the clip range
    w = rng.uniform(0, 1, n)
    config = SecAggConfig(
        neighbours=neighbours, threshold=threshold, scale=2.0**14, out_of_range="clip"
    )
    try:
        _, rnd = _open(n, d, config=config, seed=seed)
    except InsecureParameterError as refusal:
        # The colluder floor depends on n: a threshold that the graph of n clients makes unsafe
        # is refused when the round opens, naming the floor (a refusal, as the property allows).
        assert "below the floor" in str(refusal)
        assert k < n - 1 or threshold is not None
        return
    submitted, dropped = set(), set()
    for c in range(n):
        if status[c] == "before":
            rnd.drop(c)
            dropped.add(c)
        elif status[c] in ("ok", "after"):
            rnd.submit(c, x[c], weight=w[c] if weighted else None)
            submitted.add(c)
    for c in range(n):
        if status[c] == "after":
            rnd.drop(c)
            dropped.add(c)
    expected_ok = _oracle_succeeds(rnd, n, submitted, dropped)
    if expected_ok:
        aggregate = rnd.result()
        members = sorted(submitted)
        weights = w[members] if weighted else np.ones(len(members))
        clipped = np.clip(weights[:, None] * x[members], -1, 1)
        _check_close(aggregate.total, clipped.sum(0), config.fixed_point.error_bound(len(members)))
        assert aggregate.contributors.tolist() == members
        if weighted:
            assert abs(aggregate.weight - weights.sum()) <= len(members) / config.scale
    else:
        with pytest.raises(AggregationError):
            rnd.result()
        assert "total" not in rnd.view.aggregate and "ring_sum" not in rnd.view.aggregate
        with pytest.raises(AggregationError, match="refused"):
            rnd.result()


# ----------------------------------------------------------------------------- refusals
def test_too_many_dropouts_refused_without_output():
    n, d = 10, 3
    _, rnd = _open(n, d, config=SecAggConfig(neighbours=4))  # t = 3
    for c in range(n):
        rnd.submit(c, np.ones(d) * 0.1)
    for c in range(n):
        if c not in (0, 1):
            rnd.drop(c)  # only two helpers remain: fewer than t for everyone
    with pytest.raises(AggregationError, match="too many clients dropped"):
        rnd.result()
    assert "total" not in rnd.view.aggregate
    assert not any("revealed_self_seed" in p for p in rnd.view.payloads.values())


def test_modulus_wrap_refused_at_open_round():
    config = SecAggConfig(clip=2.0**10, scale=2.0**16)
    assert config.fixed_point.max_clients == 31
    transport = SecAggTransport(config)
    with pytest.raises(ModulusOverflowError, match="wrap"):
        transport.open_round(0, range(32), shape=(1, 2), seeds=SeedTree(0))
    assert len(transport.view) == 0  # nothing was opened
    transport.open_round(0, range(31), shape=(1, 2), seeds=SeedTree(0))


@pytest.mark.parametrize(
    ("config", "n", "match"),
    [
        (SecAggConfig(neighbours=4, threshold=2), 10, "at most half"),
        (SecAggConfig(neighbours=6, threshold=1), 10, "at most half"),
        (SecAggConfig(neighbours=4, threshold=5), 10, "exceeds"),
        (SecAggConfig(neighbours=1), 6, "disconnected"),
        (SecAggConfig(threshold=2), 30, "at most half"),  # default k = 10
    ],
)
def test_insecure_parameters_refused(config, n, match):
    with pytest.raises(InsecureParameterError, match=match):
        SecAggTransport(config).open_round(0, range(n), shape=(1, 2), seeds=SeedTree(0))


def test_bad_config_values_refused():
    for kwargs in (
        {"bits": 16},
        {"neighbours": 0},
        {"threshold": 0},
        {"prg": "rc4"},
        {"aead": "none"},
        {"expected_dropout": 0.5},
        {"failure_target": 0.0},
        {"clip": -1.0},
    ):
        with pytest.raises(ValueError):
            SecAggConfig(**kwargs)


def test_nan_wrong_length_and_heavy_weight_refused():
    n, d = 5, 4
    _, rnd = _open(n, d, config=SecAggConfig(clip=1.0))
    with pytest.raises(ValueError, match="nan"):
        rnd.submit(0, np.array([0.0, np.nan, 0.0, 0.0]))
    with pytest.raises(ValueError, match="inf"):
        rnd.submit(0, np.array([0.0, np.inf, 0.0, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        rnd.submit(0, np.zeros(d + 1))
    with pytest.raises(ValueError, match="clip range"):
        rnd.submit(0, np.zeros(d), weight=1.5)
    rnd.submit(0, np.zeros(d), weight=0.5)
    with pytest.raises(ValueError, match="weight"):
        rnd.submit(1, np.zeros(d))  # this round's clients send weights
    assert rnd.submitted == {0}
    for c in range(1, n):
        rnd.submit(c, np.full(d, 0.5), weight=1.0)
    aggregate = rnd.result()
    _check_close(aggregate.total, np.full((1, d), 2.0), rnd.error_bound())


def test_tampered_share_refused():
    n, d = 8, 3
    _, rnd = _open(n, d)
    for c in range(n):
        rnd.submit(c, np.full(d, 0.25))
    recipient = 0
    sender = int(rnd.neighbours(recipient)[0])
    blob = bytearray(rnd.share_store[(sender, recipient)])
    blob[-1] ^= 0x01
    rnd.share_store[(sender, recipient)] = bytes(blob)
    with pytest.raises(ShareDecryptionError, match=f"from client {sender} to client {recipient}"):
        rnd.result()
    assert "total" not in rnd.view.aggregate
    assert not any("unmask_shares" in p for p in rnd.view.payloads.values())  # nothing revealed
    with pytest.raises(AggregationError, match="refused"):
        rnd.result()  # a refused round stays refused


def test_misrouted_and_replayed_shares_refused():
    n, d = 8, 3
    _, rnd = _open(n, d)
    v = 1
    u, w = (int(c) for c in rnd.neighbours(v)[:2])
    rnd.share_store[(u, v)] = rnd.share_store[(w, v)]  # the server swaps senders
    for c in range(n):
        rnd.submit(c, np.zeros(d))
    with pytest.raises(ShareDecryptionError):
        rnd.result()

    # Replay across rounds: round 1 relays round 0's ciphertext for the same pair.
    complete = SecAggTransport(SecAggConfig(neighbours=100))
    first = complete.open_round(0, range(6), shape=(1, d), seeds=SeedTree(0))
    second = complete.open_round(1, range(6), shape=(1, d), seeds=SeedTree(0))
    second.share_store[(4, 5)] = first.share_store[(4, 5)]
    for c in range(6):
        second.submit(c, np.zeros(d))
    with pytest.raises(ShareDecryptionError, match="from client 4 to client 5"):
        second.result()


# ----------------------------------------------------------------------------- what the server sees
def test_masked_upload_is_uniform_and_independent_of_the_input():
    n, d = 6, 40_000
    config = SecAggConfig(neighbours=4)

    def upload(value):
        _, rnd = _open(n, d, config=config, seed=11)
        for c in range(n):
            rnd.submit(c, np.full(d, value))
        rnd.result()
        return rnd.view.payload(2)["masked"], rnd

    zeros, rnd = upload(0.0)
    maxed, _ = upload(1.0)
    for masked in (zeros, maxed):
        top = (masked >> np.uint32(24)).astype(np.int64)  # top 8 bits: 256 bins
        assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-3
        assert stats.kstest(masked / 2.0**32, "uniform").pvalue > 1e-3
    # Same masks (same seeds), very different inputs: indistinguishable distributions.
    assert stats.ks_2samp(zeros, maxed).pvalue > 1e-3
    # Even with the self mask the server rebuilt, the pairwise masks still hide the input.
    payload = rnd.view.payload(2)
    self_mask = prg.expand_mask(
        payload["revealed_self_seed"].tobytes(), d, bits=32, domain=prg.DOMAIN_SELF_MASK
    )
    residue = payload["masked"] - self_mask
    assert stats.kstest(residue / 2.0**32, "uniform").pvalue > 1e-3
    assert np.mean(residue == 0) < 0.001


@pytest.mark.parametrize(
    ("server", "auth"),
    [("malicious", "macs"), ("malicious", "signatures"), ("honest_but_curious", "signatures")],
)
def test_view_records_what_the_server_sees_and_counts_bytes(server, auth):
    n, d = 6, 10
    transport, rnd = _open(n, d, config=SecAggConfig(neighbours=4, server=server, auth=auth))
    for c in range(n):
        rnd.submit(c, np.full(d, 0.1))
    aggregate = rnd.result()
    payload = rnd.view.payload(0)
    k = rnd.neighbours_k
    assert payload["c_public"].shape == (32,) and payload["s_public"].shape == (32,)
    assert payload["shares_sent"].shape == (k * secagg.SEALED_SHARE_BYTES,)
    assert payload["shares_sent"].dtype == np.uint8
    assert secagg.SEALED_SHARE_BYTES == 12 + 66 + 16
    assert payload["masked"].dtype == np.uint32
    np.testing.assert_allclose(rnd.view.aggregate["total"], aggregate.total)
    assert rnd.view.aggregate["ring_sum"].dtype == np.uint32
    # Bytes up: 2 keys + k sealed shares (with recipient ids) + d values x 4 B + k revealed shares.
    expected_up = 64 + k * (8 + 94) + d * 4 + k * (8 + 33)
    expected_down = k * (8 + 64) + k * (8 + 94) + k * 8
    if server == "malicious" and auth == "signatures":
        # A signed advertisement (64 B up, relayed to k neighbours), the survivor set (n ids
        # down), a ConsistencyCheck signature (64 B up) and the k neighbours' ones with ids.
        expected_up += 64 + 64
        expected_down += k * 64 + n * 8 + k * (8 + 64)
        assert payload["advert_signature"].shape == (64,)
    elif server == "malicious":
        # A MAC per neighbour on the advertisement and on the survivor set (with the
        # recipient's id, 8 + 32 B up each), the neighbours' tags addressed to this client
        # (32 B each, then 8 + 32 B with the sender's id) and the survivor set (n ids down).
        expected_up += k * (8 + 32) + k * (8 + 32)
        expected_down += k * 32 + n * 8 + k * (8 + 32)
        assert payload["advert_signature"].shape == (k * (8 + 32),)
    assert rnd.view.bytes_up.tolist() == [expected_up] * n
    assert rnd.view.bytes_down.tolist() == [expected_down] * n
    public = transport.public_parameters()
    for key in ("bits", "scale", "clip", "neighbours", "threshold", "prg", "aead"):
        assert key in public and key in transport.view.public
    assert rnd.view.public["secagg_k"] == k and rnd.view.public["secagg_t"] == rnd.threshold
    # No field of the view holds the plaintext update.
    for fields in rnd.view.payloads.values():
        for value in fields.values():
            assert not np.allclose(np.asarray(value, dtype=float)[:d], 0.1)


def test_view_round_trips_through_save(tmp_path):
    transport, rnd = _open(5, 4)
    for c in range(5):
        rnd.submit(c, np.full(4, 0.2))
    rnd.result()
    loaded = ServerView.load(transport.view.save(tmp_path / "view"))
    np.testing.assert_array_equal(
        loaded.round(0).payload(3)["masked"], rnd.view.payload(3)["masked"]
    )
    assert loaded.public["aead"] == "aes-256-gcm"


# ----------------------------------------------------------------------------- graph and sizing
@pytest.mark.parametrize(
    ("n", "k"), [(2, 1), (5, 2), (5, 4), (10, 3), (10, 7), (30, 10), (101, 14)]
)
def test_neighbour_graph_is_regular_symmetric_and_public(n, k):
    seed = bytes(32)
    graph = secagg.neighbour_graph(n, k, seed)
    assert graph.shape == (n, k)
    adjacency = np.zeros((n, n), bool)
    adjacency[np.repeat(np.arange(n), k), graph.ravel()] = True
    assert not adjacency.diagonal().any()
    assert (adjacency == adjacency.T).all() and (adjacency.sum(1) == k).all()
    np.testing.assert_array_equal(graph, secagg.neighbour_graph(n, k, seed))  # every party agrees
    assert not np.array_equal(graph, secagg.neighbour_graph(n, k, b"\x01" * 32)) or k == n - 1


def test_default_sizes_and_dropout_sizing():
    assert secagg.default_neighbours(1000) == 20 and secagg.default_neighbours(10) == 7
    assert secagg.effective_neighbours(9, 3) == 4  # odd k on odd n: raised by one
    assert secagg.effective_neighbours(10, 50) == 9
    assert secagg.default_threshold(20) == 11
    for m, k, p in [(3, 10, 0.4), (10, 20, 0.7), (0, 5, 0.5)]:
        assert secagg.binomial_cdf(m, k, p) == pytest.approx(stats.binom.cdf(m, k, p), rel=1e-9)
    k = secagg.neighbours_for_dropout(1000, 0.1, 1e-3)
    assert k > 20 and secagg.unmasking_failure_bound(1000, k, k // 2 + 1, 0.1) <= 1e-3
    config = SecAggConfig(expected_dropout=0.3)
    assert config.round_parameters(1000)[0] > 100
    assert SecAggConfig(expected_dropout=0.3).round_parameters(50)[0] == 49  # complete graph


def test_an_automatic_scale_is_public_and_fixed_per_round():
    """The transport records the rule; each round fixes its value, and its parties use it."""
    from securefed.crypto.fixed_point import largest_safe_scale
    from securefed.transport.secagg.config import AUTOMATIC_SCALE

    config = SecAggConfig(bits=64, clip=8.0, neighbours=4)
    transport = SecAggTransport(config)
    assert transport.public_parameters()["scale"] == AUTOMATIC_SCALE
    rnd = transport.open_round(0, range(9), shape=(1, 2), seeds=SeedTree(0))
    assert rnd.config == config.for_round(9)
    assert rnd.config.scale == largest_safe_scale(9, 8.0, 64) == 2.0**56
    fixed = SecAggConfig(scale=2.0**10)
    assert fixed.for_round(9) == fixed and fixed.fixed_point_for(9).scale == 2.0**10
