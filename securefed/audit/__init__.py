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
"""

from securefed.audit.findings import (
    CHECKS,
    CKKS_MAX_COEFF_BITS_128,
    KNOWN_KEYS,
    REVEALS,
    AuditFailed,
    AuditReport,
    Finding,
    audit,
    declare_uploads,
    load_config,
    server_sees_clear_updates,
)

__all__ = [
    "CHECKS",
    "CKKS_MAX_COEFF_BITS_128",
    "KNOWN_KEYS",
    "REVEALS",
    "AuditFailed",
    "AuditReport",
    "Finding",
    "audit",
    "declare_uploads",
    "load_config",
    "server_sees_clear_updates",
]
