"""Secure aggregation at its floor, round four (issue 32): the whole-vector encoding.

``encode_input`` now draws a client's rounding uniforms in one keystream call and encodes the
vector in whole-vector passes (``Encoder.encode``) instead of block by block
(``Encoder.encode_blocks`` over ``UniformSource.blocks``, main's path at f8f07c6). Checked here:
the same ring elements and clip counts as main's path and as the reference functions
(``clip_values``, ``stochastic_round``, ``to_ring``), bit for bit; the same payloads and ring sum
of a seeded round; the same refusals (NaN, infinities, values out of range); and the rounding
still unbiased.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_secagg_floor_round3 import VARIANTS, _round_bytes

from securefed.crypto import fixed_point as fpm
from securefed.crypto import prg
from securefed.transport.secagg import SecAggConfig
from securefed.transport.secagg import client as client_mod

MAIN_BLOCK = 16_384  # main's ENCODING_BLOCK


def _main_encode_input(values, key, workspace, *, owner, bounds=None):
    """main's encode_input: the uniforms block by block, encoded block by block."""
    ring, n_clipped = workspace.encoder.encode_blocks(
        values, workspace.uniform.blocks(key, MAIN_BLOCK)
    )
    if n_clipped and workspace.out_of_range == "refuse":
        raise ValueError(f"client {owner}'s update has {n_clipped} value(s) outside the clip")
    return ring, n_clipped


def _reference(values, key, fp: fpm.FixedPoint, prg_name: str):
    clipped, count = fpm.clip_values(values, fp.clip)
    uniform = prg.uniform_floats(key, len(values), prg=prg_name)
    return fpm.to_ring(fpm.stochastic_round(clipped * fp.scale, uniform), fp.bits), count


def _values(length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.uniform(-1, 1, length)
    if length >= 8:
        values[::53] = rng.uniform(-5, 5, len(values[::53]))  # to clip, in several blocks
        values[[0, 1, 2, 3, -1]] = [1.0, -1.0, 2**-1074, -0.0, -(2**-1074)]
    return values


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("prg_name", ["aes-256-ctr", "chacha20"])
@pytest.mark.parametrize("length", [1, 7, 16_384, 40_001])
def test_encode_input_gives_the_ring_and_count_of_mains_block_path(bits, prg_name, length):
    """Several keys and lengths (one block, a block and a bit, several blocks)."""
    config = SecAggConfig(bits=bits, prg=prg_name, out_of_range="clip").for_round(50)
    workspace = client_mod.masking_workspace(length, config)
    for seed in range(3):
        values = _values(length, seed)
        key = bytes([seed]) * 32
        new, new_count = client_mod.encode_input(values, key, workspace, owner=0)
        new = new.copy()  # a fresh array either way; copied in case a later call reused it
        old, old_count = _main_encode_input(values, key, workspace, owner=0)
        ref, ref_count = _reference(values, key, config.fixed_point, prg_name)
        assert new.dtype == old.dtype == ref.dtype == config.fixed_point.dtype
        np.testing.assert_array_equal(new, old)
        np.testing.assert_array_equal(new, ref)
        assert new_count == old_count == ref_count
        assert (new_count > 0) == (length >= 8)


def test_encode_input_returns_a_fresh_vector_each_call():
    """The upload is masked in place and kept by the server: a later client's encoding must not
    write into an earlier one's vector."""
    config = SecAggConfig(out_of_range="clip").for_round(10)
    workspace = client_mod.masking_workspace(1000, config)
    first, _ = client_mod.encode_input(_values(1000, 1), bytes(32), workspace, owner=0)
    kept = first.copy()
    second, _ = client_mod.encode_input(_values(1000, 2), bytes([1]) * 32, workspace, owner=1)
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, kept)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("at", [0, 20_000, 39_999])
def test_encode_input_refuses_nan_and_infinities_anywhere(bad, at):
    """A NaN or an infinity would turn into an arbitrary ring element (and a wrong sum): refused
    with the cause named, even under out_of_range="clip" and at the vector's end."""
    config = SecAggConfig(out_of_range="clip").for_round(10)
    workspace = client_mod.masking_workspace(40_000, config)
    values = _values(40_000, 3)
    values[at] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        client_mod.encode_input(values, bytes(32), workspace, owner=7)


def test_encode_input_refuses_values_out_of_range_under_refuse():
    config = SecAggConfig(out_of_range="refuse").for_round(10)
    workspace = client_mod.masking_workspace(30_000, config)
    values = np.zeros(30_000)
    values[29_999] = config.clip * 1.5
    with pytest.raises(ValueError, match=r"client 7's update has 1 value\(s\) outside"):
        client_mod.encode_input(values, bytes(32), workspace, owner=7)
    values[29_999] = config.clip  # the end of the range is in range
    _, count = client_mod.encode_input(values, bytes(32), workspace, owner=7)
    assert count == 0


def test_the_rounding_stays_unbiased():
    """Each value v * scale with fraction f rounds up with probability f: over 400 keys the mean
    of the decoded values is v within 5 standard errors (a floor or a nearest rounding, biased
    by up to half a unit, fails)."""
    config = SecAggConfig(out_of_range="clip").for_round(10)
    fp = config.fixed_point
    fractions = np.array([0.0, 0.1, 0.3, 0.5, 0.77, 0.999])
    values = (np.array([3.0, -2.0, 17.0, -40.0, 0.0, 5.0]) + fractions) / fp.scale
    values = np.tile(values, 500)
    workspace = client_mod.masking_workspace(len(values), config)
    rows = []
    for i in range(400):
        ring, _ = client_mod.encode_input(values, i.to_bytes(32, "big"), workspace, owner=0)
        rows.append(fpm.from_ring(ring, fp.bits))
    units = np.stack(rows).reshape(400 * 500, len(fractions))
    target = values[: len(fractions)] * fp.scale
    assert np.all(units - np.floor(target) >= 0) and np.all(units - np.floor(target) <= 1)
    up = (units - np.floor(target)).mean(axis=0)
    se = np.sqrt(np.maximum(fractions * (1 - fractions), 1e-12) / len(units))
    assert np.all(np.abs(up - fractions) <= 5 * se + 1e-12), (up, fractions)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_a_round_gives_the_bytes_and_the_sum_of_mains_encoding(monkeypatch, variant):
    """Every payload and the ring sum of a seeded round (dropouts, values to clip), bit for bit,
    against the same round with main's block by block encoding patched in (blocks of 1000,
    several a client)."""
    new_payloads, new_sum, new_total = _round_bytes(variant)

    def main_path(values, key, workspace, *, owner, bounds=None):
        ring, n_clipped = workspace.encoder.encode_blocks(
            values, workspace.uniform.blocks(key, 1000)
        )
        if n_clipped and workspace.out_of_range == "refuse":
            raise ValueError("refused")
        return ring, n_clipped

    monkeypatch.setattr(client_mod, "encode_input", main_path)
    old_payloads, old_sum, old_total = _round_bytes(variant)
    assert new_payloads == old_payloads
    assert any(name == "masked_sha256" for _, name in new_payloads)
    np.testing.assert_array_equal(new_sum, old_sum)
    np.testing.assert_array_equal(new_total, old_total)
