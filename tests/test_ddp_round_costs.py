"""``bench ddp-vs-central`` reports every round's cost, the warm start's rounds included (issue 32).

Before, the record's ``seconds`` timed only the rounds after the warm start (one round of 100 in
the recorded run), so the noise of the other 99 rounds, drawn by the same integer mechanism, was
nowhere in it.
"""

from __future__ import annotations

from dataclasses import replace

from securefed.bench.bench_ddp import round_costs
from securefed.bench.experiment import FedMFRun, run_fedmf
from securefed.recsys.fedmf import user_level_dp_config
from securefed.views import NO_PAYLOADS


def test_every_round_of_a_warm_started_integer_dp_run_is_timed(small_split):
    config = replace(user_level_dp_config(rounds=4, server_lr=4.0, dim=3), upload="full")
    run = FedMFRun(
        config=config,
        transport="secagg+dp",
        seed=0,
        progress=False,
        keep_payloads=NO_PAYLOADS,
        warm_start_rounds=3,
        transport_options={"epsilon": 8.0, "delta": 1e-5, "dp.clip": 1.0},
    )
    record, _, _ = run_fedmf(small_split, run)
    assert len(record["round_seconds"]) == len(record["round_cpu_seconds"]) == 4
    assert all(s > 0 for s in record["round_seconds"] + record["round_cpu_seconds"])
    # ``seconds`` is the one round through secure aggregation; the warm rounds come first.
    assert record["seconds"] >= record["round_seconds"][-1]
    assert sum(record["round_seconds"]) > record["round_seconds"][-1]
    costs = round_costs("integer", record)
    assert costs["round_cpu_seconds_integer"] == record["round_cpu_seconds"]
    assert costs["total_cpu_seconds_integer"] == sum(record["round_cpu_seconds"])
    assert costs["mean_round_cpu_seconds_integer"] == sum(record["round_cpu_seconds"]) / 4


def test_a_run_without_warm_start_times_each_of_its_rounds(small_split):
    run = FedMFRun(
        config=replace(user_level_dp_config(rounds=3, server_lr=4.0, dim=3), upload="part"),
        transport="plaintext",
        seed=0,
        progress=False,
    )
    record, _, _ = run_fedmf(small_split, run)
    assert len(record["round_seconds"]) == 3 and min(record["round_seconds"]) > 0
    assert sum(record["round_seconds"]) <= record["seconds"]  # the rounds lie inside the run
