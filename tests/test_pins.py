"""Regression pins: short runs recorded before a refactor must not move.

What is compared is what is portable across CPUs. Bit-identity of float output is not: torch and
BLAS pick reduction orders by the instruction set (AVX2 against AVX-512), so the same seeded run
differs by an ulp from one machine to another (the FedSlate "five" pin differed in 9 of 80 rewards
by a relative 2.4e-16 on an AVX-512 machine). So:

- integers are compared exactly: FedHPD's CartPole returns (episode lengths), FedSlate's counts of
  rounds, learning steps and updates;
- float results within a tolerance: FedSlate's episode rewards to a relative 1e-9, and every final
  network parameter through a fingerprint (the flattened parameters' sum, L2 norm and four fixed
  Gaussian projections) to 1e-5 of the parameters' norm.

Why those tolerances: an ulp of float64 (float32 for the networks' parameters) changes results
by 1e-16 (1e-7) relative and stays there over these short schedules, while any change to the
algorithm moves a reward by O(1) and a parameter by at least a learning step (1e-3) on many
coordinates, so the projections by about 1e-3 of the norm: the gaps are several orders of
magnitude wide either side. A run whose trajectory diverges (a tie broken differently) fails the
reward or return check, as it should: ties are broken deterministically everywhere
(``securefed.ranking``).

``pins/rl_short_runs.json`` is written by ``python tests/test_pins.py --write`` (run it only when
a change is meant to move these results, and say so in the commit). ML-100K u1 vanilla FedMF
(the paper preset) with seed 0 was 0.9270085573752793 when the pins were first written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

PINS_PATH = Path(__file__).parent / "pins" / "rl_short_runs.json"

REWARD_RTOL = 1e-9
"""Relative tolerance on FedSlate's float64 episode rewards (see the module docstring)."""

FINGERPRINT_RTOL = 1e-5
"""Tolerance on a parameter fingerprint, relative to the parameters' L2 norm."""

PROJECTIONS = 4

FEDSLATE_BASE = {
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
    "seed": 0,
}
FEDSLATE_VARIANTS = {
    "paper": {},
    "item": {"alignment": "item"},
    "extended": {"variant": "extended"},
    "five": {"num_platforms": 5, "feedback": (True, True, True, False, False)},
}
FEDHPD_ALGORITHMS = ("fedhpd", "nofed", "dpa")

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def fingerprint(arrays) -> list[float]:
    """The flattened parameters' sum, L2 norm and fixed Gaussian projections (float64).

    The projection directions come from a seeded numpy ``Generator`` (PCG64, the same numbers on
    every platform), so two runs' fingerprints differ by about as much as their parameters do.
    """
    flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
    directions = np.random.default_rng(20261201).standard_normal((PROJECTIONS, flat.size))
    norm = float(np.sqrt(np.sum(flat * flat)))
    return [float(np.sum(flat)), norm, *(float(d @ flat) / np.sqrt(flat.size) for d in directions)]


def assert_fingerprint_close(actual: list[float], pinned: list[float], what: str) -> None:
    """Every entry within ``FINGERPRINT_RTOL`` times the pinned L2 norm."""
    gap = np.max(np.abs(np.asarray(actual) - np.asarray(pinned)))
    limit = FINGERPRINT_RTOL * pinned[1]
    assert gap <= limit, f"{what}: parameters moved (fingerprint gap {gap:.3g} > {limit:.3g})"


def fedslate_record(variant: str) -> dict:
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    result = run_fedslate(FedSlateConfig(**(FEDSLATE_BASE | FEDSLATE_VARIANTS[variant])))
    params = [
        p.detach().numpy()
        for name in sorted(result.networks)
        for p in result.networks[name].parameters()
    ]
    return {
        "rewards": np.asarray(result.episode_rewards, dtype=np.float64).tolist(),
        "counts": {
            "rounds": int(result.rounds),
            "learn_steps": int(result.learn_steps),
            **{f"updates_{name}": int(n) for name, n in sorted(result.updates.items())},
        },
        "params_fingerprint": fingerprint(params),
    }


def fedhpd_record(algorithm: str) -> dict:
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
        public_seed=0,
    )
    public = make_public_states(config) if algorithm == "fedhpd" else None
    (fast,) = train_population([RunSpec(config, 20, public_states=public)])
    reference = ReferenceRun(RunSpec(config, 20, public_states=public)).run()
    returns = np.asarray(fast.returns)
    if not np.array_equal(returns, np.round(returns)):
        raise ValueError("CartPole returns are episode lengths: integers expected")
    return {
        "returns": returns.astype(int).tolist(),
        "fast_params_fingerprint": fingerprint(fast.params),
        "reference_params_fingerprint": fingerprint(reference.params),
    }


def _pins() -> dict:
    return json.loads(PINS_PATH.read_text())


@pytest.mark.parametrize("variant", sorted(FEDSLATE_VARIANTS))
def test_fedslate_short_runs_match_the_pins(variant):
    pytest.importorskip("gymnasium")
    pin = _pins()["fedslate"][variant]
    record = fedslate_record(variant)
    assert record["counts"] == pin["counts"]
    np.testing.assert_allclose(record["rewards"], pin["rewards"], rtol=REWARD_RTOL, atol=0)
    assert_fingerprint_close(record["params_fingerprint"], pin["params_fingerprint"], variant)


@pytest.mark.parametrize("algorithm", FEDHPD_ALGORITHMS)
def test_fedhpd_short_runs_match_the_pins(algorithm):
    pytest.importorskip("gymnasium")
    pin = _pins()["fedhpd"][algorithm]
    record = fedhpd_record(algorithm)
    assert record["returns"] == pin["returns"]
    for key in ("fast_params_fingerprint", "reference_params_fingerprint"):
        assert_fingerprint_close(record[key], pin[key], f"{algorithm} {key}")


def test_the_fingerprint_tells_a_learning_step_from_an_ulp():
    """The tolerance's premise: an ulp passes, a step of 1e-3 on a tenth of the weights fails."""
    weights = np.random.default_rng(1).standard_normal(2000).astype(np.float32)
    pinned = fingerprint([weights])
    ulp = np.nextafter(weights, np.float32(np.inf))
    assert_fingerprint_close(fingerprint([ulp]), pinned, "an ulp")
    stepped = weights.copy()
    stepped[::10] -= np.float32(1e-3) * np.sign(stepped[::10])
    with pytest.raises(AssertionError, match="parameters moved"):
        assert_fingerprint_close(fingerprint([stepped]), pinned, "a step")


@pytest.mark.needs_data
def test_ml100k_u1_vanilla_fedmf_with_the_paper_preset(ml100k, tmp_path):
    from securefed.bench.cli import main

    out = tmp_path / "run.json"
    args = ["--data", str(ml100k), "--split", "u1", "--preset", "paper", "--seed", "0"]
    code = main(["fedmf", *args, "--json", str(out), "--no-progress"])
    assert code == 0
    # 100 rounds of numpy float64 products: cross-CPU drift is about 1e-13; 1e-7 is far below
    # what any change to the algorithm moves (1e-4 and more).
    assert json.loads(out.read_text())["rmse"] == pytest.approx(0.9270085573752793, abs=1e-7)


def write_pins() -> None:
    """Record the pins from this checkout (``python tests/test_pins.py --write``)."""
    import torch

    torch.set_num_threads(1)
    pins = {
        "fedslate": {variant: fedslate_record(variant) for variant in sorted(FEDSLATE_VARIANTS)},
        "fedhpd": {algorithm: fedhpd_record(algorithm) for algorithm in FEDHPD_ALGORITHMS},
    }
    PINS_PATH.write_text(json.dumps(pins, indent=1) + "\n")
    print(f"wrote {PINS_PATH}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_pins.py --write")
    write_pins()
