"""Regression pins: figures recorded before a refactor must not move by a bit.

``pins/rl_short_runs.json`` holds FedSlate's and FedHPD's results on short schedules as the code
gave them before the one-import-name move (the episode rewards, and a SHA-256 of every final
network parameter as float64 bytes). ML-100K u1 vanilla FedMF with the CLI's defaults and seed 0
was 0.9270085573752793 then.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

PINS = json.loads((Path(__file__).parent / "pins" / "rl_short_runs.json").read_text())

FEDSLATE_BASE = {
    "seed": 0,  # the pins were made with seed 0 (the default before secure-by-default)
    "num_candidates": 6,
    "slate_size": 2,
    "steps_per_platform": 12,
    "episodes": 8,
    "members": 2,
    "burn_in": 8,
    "learn_every": 3,
    "buffer_size": 32,
    "batch_size": 4,
    "local_hidden": (8,),
    "server_hidden": (4,),
}
FEDSLATE_VARIANTS = {
    "paper": {},
    "item": {"alignment": "item"},
    "extended": {"variant": "extended"},
    "five": {"num_platforms": 5, "feedback": (True, True, True, False, False)},
}

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _digest(arrays) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(np.asarray(array, dtype=np.float64)).tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("variant", sorted(FEDSLATE_VARIANTS))
def test_fedslate_short_runs_are_bit_identical_to_the_pins(variant):
    pytest.importorskip("gymnasium")
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    result = run_fedslate(FedSlateConfig(**(FEDSLATE_BASE | FEDSLATE_VARIANTS[variant])))
    pin = PINS["fedslate"][variant]
    np.testing.assert_array_equal(np.asarray(result.episode_rewards), np.asarray(pin["rewards"]))
    params = [
        p.detach().numpy()
        for name in sorted(result.networks)
        for p in result.networks[name].parameters()
    ]
    assert _digest(params) == pin["params_sha256"]


@pytest.mark.parametrize("algorithm", ["fedhpd", "nofed", "dpa"])
def test_fedhpd_short_runs_are_bit_identical_to_the_pins(algorithm):
    pytest.importorskip("gymnasium")
    from securefed.rl.fast import make_public_states, train_population
    from securefed.rl.fedhpd import FedHPDConfig, ReferenceRun, RunSpec
    from securefed.rl.policies import AGENTS

    cartpole = AGENTS["cartpole"]
    config = FedHPDConfig(
        task="cartpole",
        algorithm=algorithm,
        d=1 if algorithm == "dpa" else 2,
        rounds=6,
        agent_specs=(cartpole[0], cartpole[2], cartpole[5], cartpole[9]),
        public_size=300,
        part_size=100,
        distill_loops=2,
        virtual_rounds=8,
    )
    public = make_public_states(config) if algorithm == "fedhpd" else None
    (fast,) = train_population([RunSpec(config, 20, public_states=public)])
    reference = ReferenceRun(RunSpec(config, 20, public_states=public)).run()
    pin = PINS["fedhpd"][algorithm]
    np.testing.assert_array_equal(fast.returns, np.asarray(pin["returns"]))
    assert _digest(fast.params) == pin["fast_params_sha256"]
    assert _digest(reference.params) == pin["reference_params_sha256"]


@pytest.mark.needs_data
def test_ml100k_u1_vanilla_fedmf_with_the_cli_defaults(ml100k, tmp_path):
    from securefed.bench.cli import main

    out = tmp_path / "run.json"
    args = ["--data", str(ml100k), "--split", "u1", "--seed", "0", "--json", str(out)]
    code = main(["fedmf", *args, "--no-progress"])
    assert code == 0
    assert json.loads(out.read_text())["rmse"] == 0.9270085573752793
