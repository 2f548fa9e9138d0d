"""The privacy audit: one minimal bad configuration per finding, a clean one, views, the fixture."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import numpy as np
import pytest

from securefed import PlaintextTransport, SeedTree
from securefed.audit import AuditFailed, Finding, audit, declare_uploads
from securefed.privacy import PrivacyLedger
from securefed.transport.dp import DPTransport


def _entry_point_active() -> bool:
    return any(ep.value == "securefed.audit.pytest_plugin" for ep in entry_points(group="pytest11"))


# Until the package's pytest11 entry point is installed, load the plugin here (loading it twice
# would make pluggy refuse the second registration).
pytest_plugins = [] if _entry_point_active() else ["securefed.audit.pytest_plugin"]

CLEAN = {
    "protocol": "fedmf",
    "variant": "fedrec",
    "transport": "secagg+dp",
    "placement": "distributed",
    "dp_mechanism": "discrete_gaussian",  # float noise under secagg is flagged inexact
    "upload": "full",
    "virtual_ratings_on_scale": True,
    "pseudo_items_resampled": False,
    "epsilon": 2.1,
    "delta": 1e-5,
    "epsilon_budget": 8.0,
    "n_users": 943,
    "secagg_threshold": 600,
    "expected_dropout": 0.1,
    "expected_colluders": 50,
    "ckks_poly_modulus_degree": 8192,
    "ckks_coeff_mod_bit_sizes": [60, 40, 40, 60],
    "seeded": False,
    "secure": True,
    "accountant_sampling": "poisson",
    "sampling": "poisson",
    "sample_rate": 0.01,
    "epsilon_server": 7.9,  # the server picks the clients: charged at rate 1
}


def test_clean_config_has_no_findings():
    report = audit(CLEAN)
    assert report.findings == [] and report.ok
    report.assert_ok(max_epsilon=8)
    assert audit({}).findings == []  # missing keys skip their checks


@pytest.mark.parametrize(
    ("changes", "code", "severity", "words"),
    [
        ({"epsilon": 9.0}, "epsilon-over-budget", "error", "exceeds the budget 8"),
        ({"delta": 0.002}, "delta-too-large", "error", "1/943"),
        (
            {"variant": "fedmf", "transport": "plaintext"},
            "fedmf-gradient-leak",
            "error",
            "Chai et al.",
        ),
        (
            {"variant": "fedmf", "transport": "plaintext+dp", "placement": "central"},
            "fedmf-gradient-leak",
            "error",
            "solves for the ratings",
        ),
        (
            {"variant": "fedmf", "transport": "secagg", "upload": "part"},
            None,
            None,
            None,
        ),
        (
            # a model of the user's own (FedMF without a variant is an error of its own)
            {
                "transport": "plaintext",
                "upload": "part",
                "variant": None,
                "protocol": "mine",
                "uploads_reveal": [],
            },
            "part-upload-reveals-items",
            "error",
            "items it rated",
        ),
        ({"virtual_ratings_on_scale": False}, "virtual-ratings-off-scale", "error", "scale"),
        ({"pseudo_items_resampled": True}, "pseudo-items-resampled", "error", "intersecting"),
        ({"expected_colluders": 600}, "secagg-threshold-collusion", "error", "colluding"),
        ({"expected_colluders": -1}, "invalid-value", "error", "expected_colluders >= 0"),
        ({"expected_dropout": 0.5}, "secagg-threshold-dropout", "error", "cannot be unmasked"),
        ({"secagg_threshold": 400}, "secagg-threshold-minority", "warning", "lies about"),
        (
            {"secagg_neighbours": 20, "secagg_threshold": 15, "expected_colluders": 2},
            None,
            None,
            None,
        ),
        (
            {"secagg_neighbours": 10, "secagg_threshold": 12, "expected_colluders": 0},
            "secagg-threshold-dropout",
            "error",
            "of 10 neighbours",
        ),
        (
            {
                "secagg_neighbours": 6,
                "secagg_threshold": 5,
                "expected_colluders": 0,
                "expected_dropout": 0.0,
            },
            "secagg-neighbours-too-few",
            "warning",
            "ln(943)",
        ),
        (
            {"ckks_coeff_mod_bit_sizes": [60, 40, 40, 40, 60]},
            "ckks-insecure-modulus",
            "error",
            "240 bits at degree 8192",
        ),
        ({"ckks_poly_modulus_degree": 6000}, "ckks-unknown-degree", "error", "6000"),
        ({"seeded": True, "secure": False}, "seeded-randomness", "error", "secure_mode"),
        ({"secure": False}, "insecure-randomness", "warning", "cryptographic"),
        ({"sampling": "fixed"}, "accountant-sampling-mismatch", "error", "fixed number"),
        ({"sampling": "all"}, "accountant-sampling-mismatch", "error", "every client"),
        (
            # FedRec's values would leak too (fedrec-values-leak): a model of the user's own
            {
                "transport": "plaintext+dp",
                "variant": None,
                "protocol": "mine",
                "uploads_reveal": [],
            },
            "distributed-dp-without-secagg",
            "error",
            "1/sqrt(n)",
        ),
        ({"delta": "tiny"}, "invalid-value", "error", "not a number"),
        ({"aggregation": "mean"}, "dp-data-dependent-denominator", "warning", "fixed"),
        ({"aggregation": "fixed", "transport": "secagg"}, None, None, None),
    ],
)
def test_each_finding_from_a_minimal_bad_config(changes, code, severity, words):
    config = {k: v for k, v in {**CLEAN, **changes}.items() if v is not None}
    report = audit(config)
    if code is None:
        assert report.findings == []
        return
    finding = report.findings[0]  # errors sort first
    assert finding.code == code, report
    # the only other finding a bad threshold brings is the (implied) minority warning
    assert set(report.codes[1:]) <= {"secagg-threshold-minority"}
    assert finding.severity == severity
    assert words in finding.cause
    assert report.ok is (severity != "error")


def test_randomness_and_sampling_exceptions():
    # A record of a test run is an error itself, and exempts nothing (issue 30, item 6).
    assert audit({**CLEAN, "seeded": True, "tests": True}).codes == [
        "test-run-record",
        "seeded-randomness",
    ]
    assert audit({**CLEAN, "seeds": {"seed": 3, "secure": False}, "seeded": None}).codes == [
        "seeded-randomness"
    ]
    assert audit({**CLEAN, "sampling": "all", "sample_rate": 1.0}).findings == []
    assert audit({**CLEAN, "sampling": "fixed", "placement": "local"}).findings == []


def test_secagg_transport_keys_are_read_too():
    base = {"transport": "secagg", "n_clients": 100, "expected_dropout": 0.3}
    assert audit({**base, "threshold": 80, "neighbours": 99}).codes == ["secagg-threshold-dropout"]
    assert audit({**base, "threshold": "floor(k/2)+1", "neighbours": "ceil(2 log2 n)"}).codes == []


def test_strict_mode_and_assert_ok():
    bad = {**CLEAN, "variant": "fedmf", "transport": "plaintext", "secure": False}
    with pytest.raises(AuditFailed, match="fedmf-gradient-leak") as caught:
        audit(bad, strict=True)
    assert [f.code for f in caught.value.findings] == ["fedmf-gradient-leak"]
    assert isinstance(caught.value, AssertionError)
    report = audit({**CLEAN, "secure": False})  # a warning only
    report.assert_ok()
    assert audit(bad).findings[0].severity == "error"  # errors sort first
    with pytest.raises(AuditFailed, match="epsilon-over-max"):
        audit(CLEAN).assert_ok(max_epsilon=1.0)
    with pytest.raises(AuditFailed, match="epsilon-unknown"):
        audit({k: v for k, v in CLEAN.items() if k != "epsilon"}).assert_ok(max_epsilon=8)
    with pytest.raises(ValueError, match="severity"):
        Finding("fatal", "x", "y")


def _dp_run(seeds, sampling="poisson"):
    ledger = PrivacyLedger(budget=(8.0, 1e-5), sampling=sampling)
    dp = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=1.0, ledger=ledger, sample_rate=0.01
    )
    for round_id in range(3):
        rnd = dp.open_round(round_id, [0, 1, 2], shape=(2, 2), seeds=seeds)
        rnd.submit(0, np.ones(4))
        rnd.result()
    return dp, ledger


def test_audit_of_a_saved_dp_view_and_a_run_json(tmp_path):
    with pytest.warns(UserWarning, match="fixed-size client sampling"):
        dp, ledger = _dp_run(SeedTree(1), sampling="fixed")
    dp.view.save(tmp_path / "view")
    report = audit(tmp_path / "view")
    assert report.epsilon == pytest.approx(ledger.epsilon())
    assert report.config["transport"] == "plaintext+dp"
    # The algorithm declared nothing, and central DP shows the server each update.
    assert set(report.codes) == {
        "seeded-randomness",
        "accountant-sampling-mismatch",
        "uploads-undeclared",
    }
    assert audit(tmp_path / "view" / "manifest.json").codes == report.codes
    assert audit(dp.view).codes == report.codes
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"config": {"variant": "fedmf"}, "transport": "plaintext"}))
    assert audit(run).codes == ["fedmf-gradient-leak"]
    with pytest.raises(FileNotFoundError, match=r"manifest\.json"):
        audit(tmp_path)
    with pytest.raises(TypeError, match="mapping"):
        audit(42)


def test_the_fixture(securefed_audit):
    dp, _ = _dp_run(SeedTree.secure_mode())
    declare_uploads(dp, protocol="sum-of-ones", reveals=[])  # nothing private is uploaded
    report = securefed_audit(dp.view)
    assert report.findings == []
    report.assert_ok(max_epsilon=8, against=["released_model"])
    with pytest.raises(AuditFailed, match="against the server"):
        report.assert_ok(max_epsilon=8)  # central DP: the server saw the sum un-noised
    assert securefed_audit is audit
