"""The empirical audit on FedSlate: canary users in one run, guesses from the server's view
(Steinke, Nasr and Jagielski 2023). In the clear the server's score finds the included canaries
(the bound is above 0: the scorer has power); under DP at epsilon 8 the bound stays below
the ledger's epsilon for the same scorer."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("gymnasium")

from securefed import ALL_PAYLOADS  # noqa: E402
from securefed.audit.empirical import (  # noqa: E402
    EmpiricalAuditConfig,
    Scorer,
    run_empirical_audit,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")

AUDIT_SHAPE = {
    "steps_per_platform": 6, "episodes": 16, "members": 8, "burn_in": 12, "learn_every": 3,
    "buffer_size": 24, "target_sync": 12,
}  # fmt: skip


def _audit(shape: dict, fusion_options: dict):
    from securefed.attacks.fedslate_canaries import (
        CanaryUsers,
        acting_row_score,
        insert_canary_users,
    )
    from securefed.rl.fedslate import FedSlateConfig, run_fedslate

    config = FedSlateConfig(**shape | AUDIT_SHAPE, **fusion_options)
    plan = CanaryUsers(tuple(range(1, 15)), config.members, config.steps_per_platform)

    def run_job(included):
        hook = insert_canary_users(plan, included)
        return run_fedslate(config, keep_payloads=ALL_PAYLOADS, on_reset=hook).fusion_view

    def epsilon_of(view, observer):
        dp = view.public.get("dp")
        return float("inf") if dp is None else dp["epsilon_spent"]["A"]

    scorer = Scorer(
        "server",
        lambda view, i: acting_row_score(view, plan, i),
        description="A's acting rows of the canary's episode against its neighbours'",
    )
    audit = EmpiricalAuditConfig(n_canaries=plan.count, guess_fractions=(0.1, 0.25, 0.5))
    return run_empirical_audit(
        audit,
        run_job,
        {"acting_rows": scorer},
        rng=np.random.default_rng(7),
        epsilon_of=epsilon_of,
    )["acting_rows"]


def test_the_canary_audit_finds_users_in_the_clear_and_stays_below_the_dp_ledger(fedslate_small):
    plain = _audit(fedslate_small, {})
    # 112 canaries, one run: a bound above 0 at 95% confidence means the server's score finds
    # the included canaries in the clear (its guesses beat coin flips beyond chance).
    assert plain.epsilon_lower > 0.0, plain.tried
    private = _audit(fedslate_small, {"fusion": "dp", "dp_epsilon": 8.0})
    assert private.epsilon_ledger is not None and private.epsilon_ledger <= 8.0
    assert private.epsilon_lower < private.epsilon_ledger, private.tried
    assert private.epsilon_lower < plain.epsilon_lower
