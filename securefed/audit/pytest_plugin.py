"""pytest plugin: the ``securefed_audit`` and ``securefed_privacy_audit`` fixtures.

Registered as the ``securefed`` entry point of the ``pytest11`` group, so any test of a project
that installs securefed can write::

    def test_privacy(securefed_audit):
        securefed_audit("runs/latest/view").assert_ok(max_epsilon=8)

and, to measure rather than read the parameters (:mod:`securefed.audit.empirical`)::

    @pytest.mark.privacy_audit
    def test_noise_really_goes_in(securefed_privacy_audit):
        securefed_privacy_audit(job, scorers, config=EmpiricalAuditConfig(n_canaries=300),
                                rng=np.random.default_rng(0), epsilon_of=ledger_epsilon)

The empirical fixture runs the job once with canaries and fails the test when a measured
epsilon lower bound exceeds the ledger's epsilon for its observer. It runs only in tests marked
``privacy_audit`` (a test that asks for it unmarked fails, naming the marker), so a suite
selects or skips these runs with ``-m privacy_audit`` / ``-m "not privacy_audit"``.

Without the entry point, enable it with ``pytest -p securefed.audit.pytest_plugin`` or
``pytest_plugins = ["securefed.audit.pytest_plugin"]`` in the root ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from securefed.audit.empirical import (
    EmpiricalAuditConfig,
    EmpiricalAuditResult,
    Scorer,
    check_against_ledger,
    run_empirical_audit,
)
from securefed.audit.findings import AuditReport, audit

MARKER = "privacy_audit"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: runs an empirical privacy audit (canaries, one federated run); select with "
        f"-m {MARKER}",
    )


@pytest.fixture
def securefed_audit() -> Callable[..., AuditReport]:
    """The :func:`securefed.audit.audit` function: ``securefed_audit(cfg, strict=False)``."""
    return audit


@pytest.fixture
def securefed_privacy_audit(
    request: pytest.FixtureRequest,
) -> Callable[..., dict[str, EmpiricalAuditResult]]:
    """Run an empirical audit and fail when a lower bound exceeds the ledger's epsilon.

    Returns ``audit(job, scorers, *, config, rng, epsilon_of, delta_of=None)`` (the arguments
    of :func:`securefed.audit.empirical.run_empirical_audit`), which returns the results by
    scorer name, or raises :class:`~securefed.audit.empirical.EmpiricalAuditFailed` (an
    ``AssertionError``: the test fails) naming each observer whose bound exceeds its ledger,
    Holm-corrected across the scorers (:func:`~securefed.audit.empirical.check_against_ledger`),
    or whose audit ran at a delta below the ledger's.

    Raises:
        pytest.fail: the requesting test is not marked ``privacy_audit``.
    """
    if request.node.get_closest_marker(MARKER) is None:
        pytest.fail(
            f"the securefed_privacy_audit fixture runs a federated job: mark the test "
            f"@pytest.mark.{MARKER} so that it runs only where wanted",
            pytrace=False,
        )

    def run(
        job: Callable[[np.ndarray], Any],
        scorers: Mapping[str, Scorer],
        *,
        config: EmpiricalAuditConfig,
        rng: np.random.Generator,
        epsilon_of: Callable[[Any, str], float | None],
        delta_of: Callable[[Any], float | None] | None = None,
    ) -> dict[str, EmpiricalAuditResult]:
        results = run_empirical_audit(
            config, job, scorers, rng=rng, epsilon_of=epsilon_of, delta_of=delta_of
        )
        check_against_ledger(results)
        return results

    return run
