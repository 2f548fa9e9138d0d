"""Secure aggregation at its floor, round six (issue 32): the input read once, the stream ahead.

Three changes, each checked bit for bit against main's path patched back in:

* ``SecAggRound.submit`` reads an unweighted vector's minimum and maximum once (a NaN or an
  infinity makes one of them non-finite and is refused with the generic path's own error) and
  hands them to the encoder, instead of the generic ``RowUpdates`` (whose finiteness check is a
  sum over the vector) followed by the encoder's own two reductions;
* ``Encoder.encode(..., bounds=...)`` takes those two reductions instead of computing them;
* a seeded client reads its keystream ahead in chunks and hands the bytes out in order, instead
  of one keystream call per Shamir candidate and nonce draw.

A seeded round's every payload (sealed shares, masked uploads, revealed secrets), its ring sum
and its decoded total equal main's, for 32- and 64-bit rings, both threat models, in-range and
clipped inputs, dropouts before and after masking; the refusals (NaN, infinities, a repeated or
dropped client, a client outside the round, a finished round, a wrong shape) are main's, word for
word, and leave the round as main leaves it.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, SeedTree
from securefed.crypto import prg
from securefed.crypto.fixed_point import Encoder, FixedPoint
from securefed.errors import AggregationError
from securefed.transport.base import AggregationRound
from securefed.transport.secagg import SecAggConfig, SecAggTransport
from securefed.transport.secagg import client as client_mod
from securefed.transport.secagg import server as server_mod

N_CLIENTS, LENGTH = 14, 1500


def _main_randbytes(self, n: int) -> bytes:
    """main's ``_ClientRandomness.randbytes``: one keystream call per draw."""
    return os.urandom(n) if self.secure else self._stream(n)


def _patch_main_paths(monkeypatch) -> None:
    monkeypatch.setattr(server_mod.SecAggRound, "submit", AggregationRound.submit)
    monkeypatch.setattr(client_mod._ClientRandomness, "randbytes", _main_randbytes)


VARIANTS = [
    {"server": "honest_but_curious"},
    {"server": "malicious", "auth": "macs"},
    {"server": "malicious", "auth": "signatures"},
]


def _round_bytes(variant: dict, bits: int, seed: int, spread: float):
    """Every payload the view keeps (SHA-256 per client and field; the masked uploads
    themselves), the ring sum, the decoded total and the clipped count of one seeded round on
    inputs uniform in ``[-spread, spread]`` (clip 1: ``spread > 1`` clips some): two clients drop
    before masking (their pairwise masks removed by the server), one after."""
    config = SecAggConfig(neighbours=7, bits=bits, out_of_range="clip", **variant)
    transport = SecAggTransport(config, keep_payloads=ALL_PAYLOADS, keep_masked=True)
    rng = np.random.default_rng(seed)
    values = rng.uniform(-spread, spread, (N_CLIENTS, LENGTH))
    values[3, :4] = [1.0, -1.0, np.nextafter(1.0, 2.0), np.nextafter(-1.0, -2.0)]
    before = rng.choice(N_CLIENTS, 2, replace=False).tolist()
    after = rng.choice(sorted(set(range(N_CLIENTS)) - set(before) - {3}))
    rnd = transport.open_round(seed, range(N_CLIENTS), shape=(1, LENGTH), seeds=SeedTree(seed))
    for c in before:
        rnd.drop(c)
    for c in range(N_CLIENTS):
        if c not in before:
            rnd.submit(np.int64(c) if c % 2 else c, values[c])
    rnd.drop(int(after))
    total = rnd.result().total
    payloads = {
        (c, name): hashlib.sha256(np.ascontiguousarray(field).tobytes()).hexdigest()
        for c, fields in rnd.view.payloads.items()
        for name, field in fields.items()
    }
    clipped = rnd.view.public["secagg_values_clipped"]
    return payloads, np.array(rnd.view.aggregate["ring_sum"]), total, clipped


@pytest.mark.parametrize("spread", [1.0, 1.2])
@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_a_round_gives_the_bytes_and_the_sum_of_mains_paths(monkeypatch, variant, bits, spread):
    for seed in (1, 2):
        new = _round_bytes(variant, bits, seed, spread)
        with monkeypatch.context() as patched:
            _patch_main_paths(patched)
            old = _round_bytes(variant, bits, seed, spread)
        assert new[0] == old[0]
        kinds = {name for _, name in new[0]}
        assert {"masked", "shares_sent", "revealed_self_seed", "revealed_mask_key"} <= kinds
        assert new[1].dtype == np.dtype(f"uint{bits}")
        np.testing.assert_array_equal(new[1], old[1])
        np.testing.assert_array_equal(new[2], old[2])
        assert new[3] == old[3] and (new[3] > 2 if spread > 1 else new[3] == 2)


def test_the_comparison_sees_another_stream(monkeypatch):
    """The equality above is not vacuous: a stream read one byte off (other Shamir coefficients
    and nonces) gives other sealed shares, which the comparison sees."""
    new_payloads = _round_bytes(VARIANTS[0], 32, 1, 1.0)[0]

    def shifted(self, n):
        return self._stream(n + 1)[1:]

    monkeypatch.setattr(client_mod._ClientRandomness, "randbytes", shifted)
    old_payloads = _round_bytes(VARIANTS[0], 32, 1, 1.0)[0]
    differ = {key[1] for key in new_payloads if new_payloads[key] != old_payloads[key]}
    assert "shares_sent" in differ


def test_seeded_draws_are_the_streams_successive_bytes():
    """Draws of every size (none, one byte, a chunk and more) are the keystream's bytes in
    order; a negative size is refused."""
    seeds = SeedTree(4)
    buffered = client_mod._ClientRandomness(seeds, 3, 5)
    reference = prg.KeystreamBytes(seeds.key("secagg", 3, 5, "stream"))
    sizes = [33, 0, 1, 12, client_mod._STREAM_CHUNK - 46, 33, 3 * client_mod._STREAM_CHUNK, 7]
    sizes += np.random.default_rng(0).integers(0, 600, 40).tolist()
    drawn = b"".join(buffered.randbytes(n) for n in sizes)
    assert drawn == reference(sum(sizes))
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        buffered.randbytes(-1)
    secure = client_mod._ClientRandomness(SeedTree(None), 3, 5)
    assert len(secure.randbytes(40)) == 40 and secure._ahead == b""  # the OS's, nothing kept


@pytest.mark.parametrize("bits", [32, 64])
def test_the_encoder_with_given_bounds_is_the_encoder(bits):
    """Seeded inputs, in range, at the clip's edges (exactly +-clip and the next floats out),
    -0.0, tiny negatives (whose fractional part rounds to 1), and clipped ones: the same ring
    elements and count with the bounds given as computed."""
    fp = FixedPoint(bits=bits, scale=2.0**20 if bits == 32 else 2.0**40, clip=1.5)
    rng = np.random.default_rng(bits)
    length = 4096
    edges = [1.5, -1.5, np.nextafter(1.5, 2), np.nextafter(-1.5, -2), -0.0, 0.0, -1e-300, -2e-17]
    for case in range(6):
        values = rng.uniform(-1.5, 1.5, length) if case < 3 else rng.uniform(-2, 2, length)
        if case % 3 == 1:
            values[: len(edges)] = edges
        if case % 3 == 2:
            values[: len(edges) - 4] = edges[:2] + edges[4:6]
        uniform = rng.random(length)
        encoder = Encoder(fp, length)
        expected = encoder.encode(values, uniform)
        bounds = (values.min(), values.max())
        got = encoder.encode(values, uniform, bounds=bounds)
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[0].dtype == expected[0].dtype == fp.dtype and got[1] == expected[1]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_the_encoder_refuses_non_finite_values_with_bounds_given(bad):
    fp = FixedPoint(bits=32, scale=2.0**16, clip=1.0)
    values = np.zeros(64)
    values[9] = bad
    encoder = Encoder(fp, 64)
    for bounds in (None, (values.min(), values.max())):
        with pytest.raises(ValueError, match="refuses NaN or infinite values"):
            encoder.encode(values, np.full(64, 0.5), bounds=bounds)


def _open(config: SecAggConfig | None = None, n: int = 6, length: int = 40):
    config = config or SecAggConfig(server="honest_but_curious", neighbours=4)
    return SecAggTransport(config).open_round(0, range(n), shape=(1, length), seeds=SeedTree(7))


def _refusal(monkeypatch, generic: bool, act) -> tuple[type, str]:
    with monkeypatch.context() as patched:
        if generic:
            _patch_main_paths(patched)
        with pytest.raises((ValueError, AggregationError)) as error:
            act()
    return type(error.value), str(error.value)


def _acts():
    """Refusals of a submit, each on a fresh round: (name, act)."""
    good = np.linspace(-0.5, 0.5, 40)

    def nan_at(position, value=np.nan):
        bad = good.copy()
        bad[position] = value
        return lambda: _open().submit(2, bad)

    def twice():
        rnd = _open()
        rnd.submit(1, good)
        rnd.submit(1, good)

    def dropped():
        rnd = _open()
        rnd.drop(1)
        rnd.submit(1, good)

    def finished():
        rnd = _open()
        for c in range(6):
            rnd.submit(c, good)
        rnd.result()
        rnd.submit(1, good)

    def finished_nan():
        rnd = _open()
        for c in range(6):
            rnd.submit(c, good)
        rnd.result()
        rnd.submit(1, np.full(40, np.nan))

    def refused_range():
        rnd = _open()
        rnd.submit(1, good * 10)

    def refused_then():
        rnd = _open()
        with pytest.raises(ValueError):
            rnd.submit(1, good * 10)
        rnd.submit(2, good)

    def remote():
        config = SecAggConfig(server="honest_but_curious", neighbours=4)
        transport = SecAggTransport(config, remote_clients=True)
        rnd = transport.open_round(0, range(6), shape=(1, 40), seeds=SeedTree(7))
        rnd.submit(1, good)

    return [
        ("nan", nan_at(17)),
        ("inf", nan_at(0, np.inf)),
        ("-inf", nan_at(39, -np.inf)),
        ("nan and inf", lambda: _open().submit(2, np.array([np.inf] * 20 + [np.nan] * 20))),
        ("twice", twice),
        ("dropped", dropped),
        ("outside", lambda: _open().submit(6, good)),
        ("negative id", lambda: _open().submit(-1, good)),
        ("shape", lambda: _open().submit(1, good[:-1])),
        ("2-D", lambda: _open().submit(1, good[None, :])),
        ("finished", finished),
        ("finished, NaN", finished_nan),
        ("out of range", refused_range),
        ("after a refused round", refused_then),
        ("remote clients", remote),
    ]


@pytest.mark.parametrize(("name", "act"), _acts(), ids=[name for name, _ in _acts()])
def test_a_refused_submit_is_refused_as_on_main(monkeypatch, name, act):
    assert _refusal(monkeypatch, False, act) == _refusal(monkeypatch, True, act)


def test_a_non_finite_submit_leaves_the_round_as_main_leaves_it(monkeypatch):
    """NaN refused before anything of the round changes: the client submits again, finite, and
    the round finishes with main's sum (the round is not refused, its weighting not fixed)."""

    def run() -> tuple[np.ndarray, str]:
        rnd = _open()
        bad = np.linspace(-0.5, 0.5, 40)
        bad[5] = np.nan
        with pytest.raises(ValueError, match=r"update values contains nan at index \(0, 5\)"):
            rnd.submit(0, bad)
        rnd.submit(0, np.linspace(-0.5, 0.5, 40), weight=0.5)  # the weighting is still open
        for c in range(1, 6):
            rnd.submit(c, np.full(40, 0.25), weight=1.0)
        total = rnd.result().total
        return np.array(rnd.view.aggregate["ring_sum"]), repr(total)

    new = run()
    with monkeypatch.context() as patched:
        _patch_main_paths(patched)
        old = run()
    np.testing.assert_array_equal(new[0], old[0])
    assert new[1] == old[1]


def test_the_fast_submit_is_taken_and_reads_no_row_updates(monkeypatch):
    """The bench's submit (an unweighted vector, an int id) does not build a RowUpdates, and
    the encoder gets the bounds; a weighted one takes the generic path."""
    from securefed.transport import base

    built, given = [], []
    original_init = base.RowUpdates.__init__
    original_encode = Encoder.encode

    def counting_init(self, *args, **kwargs):
        built.append(1)
        original_init(self, *args, **kwargs)

    def spying_encode(self, values, uniform, *, bounds=None):
        given.append(bounds is not None)
        return original_encode(self, values, uniform, bounds=bounds)

    monkeypatch.setattr(base.RowUpdates, "__init__", counting_init)
    monkeypatch.setattr(Encoder, "encode", spying_encode)
    rnd = _open()
    rnd.submit(0, np.zeros(40))
    rnd.submit(np.int32(1), np.zeros(40))
    assert built == [] and given == [True, True]
    weighted = _open()
    weighted.submit(0, np.zeros(40), weight=1.0)
    assert built == [1] and given[-1] is False
