"""The FedSlate leak table's encrypted rows: the server's measures from a ciphertext-only view,
B's from what it decrypted, and the bench's rows and merge (securefed.attacks.fedslate_leak,
securefed.bench.bench_fedslate_leak)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from securefed import ALL_PAYLOADS

TINY = {
    "num_candidates": 6, "slate_size": 2, "steps_per_platform": 12, "episodes": 4, "members": 1,
    "burn_in": 11, "learn_every": 12, "buffer_size": 16, "batch_size": 4, "local_hidden": (8,),
    "server_hidden": (4,), "server_activation": "polynomial", "eps_decay": 0.9,
    "seed": 0,  # seeded: the tests compare runs
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["ckks", "ckks+dp"])
def test_the_server_reads_nothing_from_ciphertexts_and_b_is_scored_on_what_it_decrypted(
    transport, torch_one_thread
):
    pytest.importorskip("tenseal")
    pytest.importorskip("gymnasium")
    from securefed.attacks.fedslate_leak import encrypted_records, measure_fedslate_leak
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    dp = {"dp_epsilon": 4.0} if transport == "ckks+dp" else {}
    config = FedSlateConfig(**TINY, fusion=transport, **dp)
    bare = run_fedslate(config, keep_payloads=ALL_PAYLOADS)
    with pytest.raises(ValueError, match="keep_clean=True"):
        measure_fedslate_leak(config, bare)  # no truth: refused, not scored against nothing
    result = run_fedslate(config, keep_payloads=ALL_PAYLOADS, keep_clean=True)
    server, platforms = encrypted_records(result)
    assert not any(np.any(v) for v in server.inputs.values())  # nothing in the clear
    # The platforms' own record is the run's: the replay walks the same users (rewards equal).
    report = measure_fedslate_leak(config, result)
    assert report["server_view"] == "ciphertexts"
    # Constant features: the fit is the public schedule's (its folds are drawn apart, so the
    # two differ by the cross-validation's choice only).
    nke = report["server_nke"]
    assert nke["attack"] <= max(nke["step_only"], nke["chance"]) + 0.05
    inquiries = platforms.inquiries * config.members
    for party in "AB":
        chance = report["server_slate"][party]["chance"]
        # A random 2-subset of 6 over 48 inquiries: chance +- 4 standard errors.
        assert abs(report["server_slate"][party]["attack"] - chance) < 4 * np.sqrt(
            chance * (1 - chance) / inquiries
        )
    assert set(report["other_platform"]) >= {"attack", "own", "chance"}
    if transport == "ckks+dp":
        rates = result.fusion_view.public["dp"]["clamp_rates"]
        assert set(rates) == {"A", "B"} and all(0 <= r["input"] < 0.01 for r in rates.values())


def _args(**changes) -> argparse.Namespace:
    from securefed.bench.bench_fedslate_leak import _finish, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    for key, value in changes.items():
        setattr(args, key, value)
    return _finish(args)


def test_the_encrypted_rows_run_fedslates_ckks_channel_beside_their_reference():
    from securefed.bench.bench_fedslate_leak import (
        POLYNOMIAL_REFERENCE,
        encrypted_rows,
        leak_config,
        refusal,
        transport_rows,
    )

    assert [row[1] for row in transport_rows((4.0,))] == ["plaintext", "dp"]
    rows = encrypted_rows((1.0, 16.0))
    assert [row[0] for row in rows] == [
        POLYNOMIAL_REFERENCE, "ckks", "ckks+dp eps=1", "ckks+dp eps=16",
    ]  # fmt: skip
    assert [row[0] for row in encrypted_rows((4.0,), ("ckks+dp",))] == ["ckks+dp eps=4"]
    args = _args()
    for _, transport, epsilon in rows:
        config = leak_config(args, transport, epsilon, encrypted=True)
        assert refusal(config) is None  # no row says "refused"
        assert config.server_hidden_activation == "polynomial" and config.members == 1
        assert config.episodes == args.ckks_episodes
    with pytest.raises(ValueError, match="ckks-episodes"):
        _args(ckks_episodes=3)


def test_the_encrypted_rows_replace_the_refused_ones_in_the_rewards_table():
    from securefed.bench.bench_fedslate_leak import markdown, merge_rewards

    mean = {"mean": 1.0, "std": 0.0}
    side = {key: mean for key in ("mean", "optimal_reward", "etror", "final")}
    reward = {"A": side, "B": side, "learn_steps": 3, "seconds": 1.0, "dp": None,
              "seconds_per_learning_step": 0.5, "bytes_per_learning_step": 2048.0}  # fmt: skip
    measures = {
        "server_nke": {"attack": 0.0, "step_only": 0.0, "chance": 0.0},
        "server_slate": {p: {"attack": 0.3, "shown_greedy": 0.3, "chance": 0.3} for p in "AB"},
        "other_platform": {"attack": 0.1, "own": 0.05, "chance": 0.0},
    }
    leak = [{"label": "ckks", "transport": "ckks", "schedule": "40 episodes, 1 member(s)",
             "epsilon": None, "noise_std": None, "mean_reward": {"A": 1.0, "B": 1.0},
             "measures": measures, "reward": reward}]  # fmt: skip
    record = {
        "rewards": {"N10_n3": {"setting": [10, 3], "rows": {
            "plaintext": {"transport": "plaintext"} | reward,
            "ckks": {"transport": "ckks", "refused": "no"},
            "ckks+dp eps=1": {"transport": "ckks+dp", "refused": "no"},
        }}, "N100_n10": {"setting": [100, 10], "rows": {
            "plaintext": {"transport": "plaintext"} | reward,
            "ckks": {"transport": "ckks", "refused": "no"},
        }}},
        "leak": leak,
        "meta": {"machine": "m", "seconds": 1.0, "schedule": "s", "leak_schedule": "l"},
    }  # fmt: skip
    merge_rewards(record)
    rows = record["rewards"]["N10_n3"]["rows"]
    assert list(rows) == ["plaintext", "ckks"] and "refused" not in rows["ckks"]
    assert rows["ckks"]["schedule"] == "40 episodes, 1 member(s)"
    assert list(record["rewards"]["N100_n10"]["rows"]) == ["plaintext"]  # not run there
    text = markdown(record)
    assert "refused" not in text and "40 episodes, 1 member(s)" in text
