"""Shared fixtures: small data sets that need nothing outside the repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from securefed.recsys.data import ML100K_SCALE, Split, random_split, synthetic_ratings

REPO_ROOT = Path(__file__).resolve().parents[1]


def ml100k_dir() -> Path | None:
    """MovieLens 100K, if this machine has it ($SECUREFED_DATA or ../shared/data)."""
    roots = [Path(os.environ["SECUREFED_DATA"])] if os.environ.get("SECUREFED_DATA") else []
    roots.append(REPO_ROOT.parent / "shared" / "data")
    for root in roots:
        if (root / "ml-100k" / "u.data").is_file():
            return root / "ml-100k"
    return None


@pytest.fixture(scope="session")
def ml100k() -> Path:
    path = ml100k_dir()
    if path is None:
        pytest.skip("MovieLens 100K not found: set SECUREFED_DATA to a directory holding ml-100k/")
    return path


@pytest.fixture(scope="session")
def small_split() -> Split:
    """120 users x 80 items, about 2400 ratings on the 1..5 scale."""
    ratings = synthetic_ratings(120, 80, 2400, rank=4, noise=0.3, scale=ML100K_SCALE, seed=3)
    return random_split(ratings, 0.2, np.random.default_rng(0))


@pytest.fixture(scope="module")
def example():
    """The FedMF example Flower app (recsys/flower_app), importable as on a SuperNode."""
    from securefed.recsys.fedmf_flower import APP_DIR

    if str(APP_DIR) not in sys.path:
        sys.path.insert(0, str(APP_DIR))
    from securefed_fedmf_app import app

    return app


@pytest.fixture(scope="module")
def torch_one_thread():
    """torch on one thread for the module (the RL learners' setting), restored afterwards."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def fedslate_small() -> dict:
    """Keywords of a tiny seeded FedSlate run that learns from its second episode (the DP
    accounting, local DP-SGD and canary-audit tests; seeded: they compare runs)."""
    return {
        "num_candidates": 6, "slate_size": 2, "steps_per_platform": 8, "episodes": 3,
        "members": 2, "burn_in": 7, "learn_every": 2, "buffer_size": 12, "batch_size": 4,
        "local_hidden": (8,), "server_hidden": (4,), "seed": 0, "target_sync": 8,
    }  # fmt: skip


@pytest.fixture
def enrolment(tmp_path):
    """Every role's FedSlate relay identity provisioned (two platforms), as the nodes'
    configs (the relay-key tests, with ``flower_fedslate.in_process_exchange`` as the honest
    server)."""
    from securefed.rl import flower_fedslate as ffs

    digest = ffs.provision_relay_identities(tmp_path, 2)
    return {
        role: {
            ffs.IDENTITY_PATH: str(tmp_path / f"identity-{role}.bin"),
            ffs.REGISTRY_PATH: str(tmp_path / "registry.bin"),
            ffs.REGISTRY_DIGEST: digest,
        }
        for role in range(3)
    }
