"""The Python API is secure unless a seed is given (issue 29, item 8).

``SeedTree()`` was the seeded tree of seed 0 while the command line was secure by default; now
``SeedTree()`` is secure mode (OS entropy, ``secure=True``) and a seed gives the seeded tree. The
audit still flags a seeded run and not the new default.
"""

from __future__ import annotations

import numpy as np
import pytest

from securefed import SeedTree
from securefed.audit import audit
from securefed.transport.secagg import SecAggConfig, SecAggTransport


def test_the_default_tree_is_secure_and_two_default_trees_differ():
    first, second = SeedTree(), SeedTree()
    assert first.secure and second.secure
    assert first.seed is None and first.randomness == "secure"
    assert first.describe() == {"seed": None, "secure": True, "randomness": "secure"}
    draws = [tree.generator("client", 0, 1).integers(0, 2**63, size=4) for tree in (first, second)]
    assert not np.array_equal(*draws)  # 2^-252 to collide by chance
    assert first.entropy != second.entropy


def test_a_seed_gives_the_reproducible_tree_that_says_it_is_not_private():
    tree = SeedTree(0)
    assert not tree.secure and tree.seed == 0 and tree.randomness == "seeded: not private"
    again = SeedTree(0).generator("init").normal(size=3)
    assert np.array_equal(tree.generator("init").normal(size=3), again)


def test_secure_mode_is_the_default_by_its_other_name():
    tree = SeedTree.secure_mode()
    assert tree.secure and tree.seed is None
    with pytest.raises(ValueError, match="refuses a seed"):
        SeedTree.secure_mode(0)


def _one_round(seeds: SeedTree):
    transport = SecAggTransport(SecAggConfig())
    rnd = transport.open_round(0, list(range(4)), shape=(1, 3), seeds=seeds)
    for client in range(4):
        rnd.submit(client, np.full(3, 0.25))
    rnd.result()
    return transport.view


def test_the_audit_flags_a_seeded_run_and_not_the_default():
    default = _one_round(SeedTree())
    assert default.rounds[0].public["secagg_secure_randomness"] is True
    codes = audit(default).codes
    assert "seeded-randomness" not in codes and "insecure-randomness" not in codes
    seeded = audit(_one_round(SeedTree(3)))
    assert "seeded-randomness" in [finding.code for finding in seeded.errors]
    assert audit({"seeds": SeedTree().describe()}).codes == []
    assert "seeded-randomness" in audit({"seeds": SeedTree(1).describe()}).codes


def test_the_fedmf_run_of_the_python_api_is_secure_unless_seeded():
    from securefed.bench.experiment import FedMFRun, run_fedmf
    from securefed.recsys.data import synthetic_ratings
    from securefed.recsys.data.splits import random_split
    from securefed.recsys.fedmf import FedMFConfig

    split = random_split(synthetic_ratings(20, 15, 150, seed=1), 0.2, np.random.default_rng(0))
    config = FedMFConfig(rounds=1, dim=2)
    record, _, _ = run_fedmf(split, FedMFRun(config=config, progress=False))
    assert record["randomness"] == "secure" and record["seed"] is None
    seeded, _, _ = run_fedmf(split, FedMFRun(config=config, seed=4, progress=False))
    assert seeded["randomness"] == "seeded: not private" and seeded["seed"] == 4


def test_fedslate_runs_are_secure_unless_seeded(tmp_path):
    pytest.importorskip("torch")
    from securefed.rl.checkpoint import EpisodeCheckpoints
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate
    from securefed.rl.slateq import SlateQConfig

    assert SlateQConfig().seed is None and FedSlateConfig().seed is None
    tiny = {
        "num_candidates": 6, "slate_size": 2, "steps_per_platform": 12, "episodes": 1,
        "members": 1, "burn_in": 11, "learn_every": 12, "buffer_size": 16, "batch_size": 4,
        "local_hidden": (8,), "server_hidden": (4,),
    }  # fmt: skip
    secure = [run_fedslate(FedSlateConfig(**tiny)).episode_rewards for _ in range(2)]
    assert not np.array_equal(*secure)  # fresh OS entropy: other users, other draws
    seeded = [run_fedslate(FedSlateConfig(**tiny, seed=5)).episode_rewards for _ in range(2)]
    assert np.array_equal(*seeded)
    with pytest.raises(ValueError, match=r"secure-mode run .* give a seed"):
        run_fedslate(FedSlateConfig(**tiny), checkpoints=EpisodeCheckpoints(tmp_path / "c.pt"))


def test_the_fedslate_command_is_secure_by_default():
    pytest.importorskip("torch")
    import argparse

    from securefed.bench.cli_fedslate import _config, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    assert _config(parser.parse_args(["fedslate"])).seed is None
    assert _config(parser.parse_args(["fedslate", "--seed", "3"])).seed == 3
