"""pytest plugin: the ``securefed_audit`` fixture.

Registered as the ``securefed`` entry point of the ``pytest11`` group, so any test of a project
that installs securefed can write::

    def test_privacy(securefed_audit):
        securefed_audit("runs/latest/view").assert_ok(max_epsilon=8)

Without the entry point, enable it with ``pytest -p securefed.audit.pytest_plugin`` or
``pytest_plugins = ["securefed.audit.pytest_plugin"]`` in the root ``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from securefed.audit.findings import AuditReport, audit


@pytest.fixture
def securefed_audit() -> Callable[..., AuditReport]:
    """The :func:`securefed.audit.audit` function: ``securefed_audit(cfg, strict=False)``."""
    return audit
