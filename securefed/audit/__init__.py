"""The privacy audit: findings about a run's public parameters, and a pytest fixture.

Example:
    >>> from securefed.audit import audit
    >>> report = audit({"variant": "fedmf", "transport": "plaintext"})
    >>> report.codes
    ['fedmf-gradient-leak']
    >>> report.ok
    False

In tests, the ``securefed_audit`` fixture (``securefed.audit.pytest_plugin``) returns
:func:`audit`: ``securefed_audit(cfg).assert_ok(max_epsilon=8)``.

The empirical audit (:mod:`securefed.audit.empirical`) measures instead of reading: canaries in
one run, an epsilon lower bound from guesses (Steinke, Nasr and Jagielski 2023), compared with
the ledger's epsilon per observer (fixture ``securefed_privacy_audit``, marker
``privacy_audit``).
"""

from securefed.audit.empirical import (
    EmpiricalAuditConfig,
    EmpiricalAuditFailed,
    EmpiricalAuditResult,
    Scorer,
    audit_scores,
    check_against_ledger,
    epsilon_lower_bound,
    run_empirical_audit,
)
from securefed.audit.findings import (
    CHECKS,
    CKKS_MAX_COEFF_BITS_128,
    KNOWN_KEYS,
    REVEALS,
    AuditFailed,
    AuditReport,
    Finding,
    audit,
    check_integrity,
    declare_uploads,
    known_keys,
    load_config,
    register_known_keys,
    server_sees_clear_updates,
)

__all__ = [
    "CHECKS",
    "CKKS_MAX_COEFF_BITS_128",
    "KNOWN_KEYS",
    "REVEALS",
    "AuditFailed",
    "AuditReport",
    "EmpiricalAuditConfig",
    "EmpiricalAuditFailed",
    "EmpiricalAuditResult",
    "Finding",
    "Scorer",
    "audit",
    "audit_scores",
    "check_against_ledger",
    "check_integrity",
    "declare_uploads",
    "epsilon_lower_bound",
    "known_keys",
    "load_config",
    "register_known_keys",
    "run_empirical_audit",
    "server_sees_clear_updates",
]
