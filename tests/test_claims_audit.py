"""Issue 17, item 7: the audit fails closed. Each test replays a case that passed the old audit.

The old audit did not read the fields that secure-aggregation and CKKS views record (a seeded
secagg view passed), ignored unknown (misspelt) keys, passed a user's own model uploading per-item
gradients in plaintext (its leak rules knew only FedMF's keys), read a run record's client sampling
only when it was a bare string, and took an epsilon amplified by sampling as the guarantee
against the server that does the sampling.
"""

from __future__ import annotations

import numpy as np
import pytest

from securefed import PlaintextTransport, SeedTree
from securefed.audit import KNOWN_KEYS, REVEALS, audit, declare_uploads
from securefed.transport import (
    available_transports,
    build_transport,
    option_groups,
    transport_names,
)
from securefed.transport.secagg import SecAggConfig, SecAggTransport


def _one_round(transport, seeds, clients=4, width=3):
    rnd = transport.open_round(0, list(range(clients)), shape=(1, width), seeds=seeds)
    for client in range(clients):
        rnd.submit(client, np.full(width, 0.25))
    rnd.result()
    return transport.view


def test_a_seeded_secure_aggregation_view_fails_the_audit():
    view = _one_round(SecAggTransport(SecAggConfig()), SeedTree(0))
    assert view.rounds[0].public["secagg_secure_randomness"] is False
    report = audit(view)
    assert "seeded-randomness" in [f.code for f in report.errors]
    # The same round in secure mode passes that check.
    secure = audit(_one_round(SecAggTransport(SecAggConfig()), SeedTree.secure_mode()))
    assert "seeded-randomness" not in secure.codes


def test_the_thresholds_a_secagg_round_used_are_checked():
    # A round's recorded t = 2 of k = 3 neighbours, with one colluding client stated.
    config = {"transport": "secagg", "secagg_n": 4, "secagg_k": 3, "secagg_t": 1, "seeded": False}
    codes = audit(config | {"expected_colluders": 1}).codes
    assert "secagg-threshold-collusion" in codes and "secagg-threshold-minority" in codes


def test_the_weakest_round_of_a_view_is_the_one_audited():
    view = _one_round(SecAggTransport(SecAggConfig()), SeedTree.secure_mode())
    strong = dict(view.rounds[0].public)
    weak = strong | {"secagg_t": 1}  # a round whose threshold a lying server lowered
    view.rounds[0].public.update(weak)
    view.open(1, np.arange(4)).public.update(strong)  # a later, honest round
    assert "secagg-threshold-minority" in audit(view).codes


@pytest.mark.parametrize(
    ("key", "hint"),
    [("secagg_treshold", "secagg_threshold"), ("epsilom", "epsilon"), ("placment", "placement")],
)
def test_a_misspelt_key_is_an_error_naming_it(key, hint):
    report = audit({"transport": "secagg", key: 1})
    (finding,) = [f for f in report.errors if f.code == "unknown-key"]
    assert repr(key) in finding.cause and repr(hint) in finding.cause
    assert not report.ok


def test_a_key_of_the_callers_own_is_accepted_when_declared():
    assert audit({"my_learning_rate": 0.1}).codes == ["unknown-key"]
    assert audit({"my_learning_rate": 0.1}, extra_keys=["my_learning_rate"]).codes == []


def test_a_users_model_uploading_per_item_gradients_in_plaintext_is_flagged():
    seeds = SeedTree.secure_mode()
    undeclared = _one_round(PlaintextTransport(), seeds)
    assert audit(undeclared).codes == ["uploads-undeclared"]
    transport = PlaintextTransport()
    declare_uploads(transport, protocol="my-item-model", reveals=["per-item-gradients"])
    report = audit(_one_round(transport, seeds))
    assert report.codes == ["uploads-reveal-in-clear"] and not report.ok
    assert "per-item gradients" in report.errors[0].cause


def test_declared_reveals_under_a_hiding_transport_pass():
    transport = SecAggTransport(SecAggConfig())
    declare_uploads(transport, protocol="my-item-model", reveals=["per-item-gradients"])
    assert audit(_one_round(transport, SeedTree.secure_mode())).findings == []


def test_declarations_are_validated():
    with pytest.raises(ValueError, match="not among"):
        declare_uploads(PlaintextTransport(), protocol="x", reveals=["everything"])
    with pytest.raises(ValueError, match="protocol"):
        declare_uploads(PlaintextTransport(), protocol="", reveals=[])
    forged = {"transport": "plaintext", "protocol": "x", "uploads_reveal": "ratings"}
    assert audit(forged).codes == ["invalid-value"]
    assert set(REVEALS) >= {"ratings", "per-item-gradients", "rated-items", "model-deltas"}


def test_a_run_records_sampling_mapping_is_read():
    # The command line records {"mode": ..., "clients_per_round": ...}; the old check skipped it.
    record = {
        "transport": "plaintext+dp",
        "placement": "central",
        "accountant_sampling": "poisson",
        "sample_rate": 0.05,
        "sampling": {"mode": "fixed", "clients_per_round": 50},
        "protocol": "fedmf",
        "variant": "fedrec",
    }
    assert "accountant-sampling-mismatch" in audit(record).codes


def test_an_amplified_epsilon_is_not_taken_as_the_guarantee_against_the_server():
    distributed = {
        "transport": "secagg+dp",
        "placement": "distributed",
        "sample_rate": 0.06,
        "epsilon": 1.73,
        "accountant_sampling": "poisson",
        "sampling": "poisson",
    }
    assert "epsilon-server-unstated" in audit(distributed).codes
    assert "epsilon-server-unstated" not in audit(distributed | {"epsilon_server": 4.73}).codes
    assert "epsilon-server-unstated" not in audit(distributed | {"sample_rate": 1.0}).codes


@pytest.mark.parametrize(
    ("flooding", "code"),
    [
        ({}, "ckks-no-flooding"),
        ({"flood_std": 0.0}, "ckks-no-flooding"),
        ({"flood_std": 2.0**-20}, "ckks-flooding-unjustified"),
        ({"flood_std": 2.0**-20, "ckks_decryption_error": 2.0**-19.1}, "ckks-flooding-below-error"),
        # Above the bound, below the floor its 40-bit level asks for (bound x 2^19.5).
        (
            {
                "flood_std": 2.0**-10,
                "ckks_decryption_error": 2.0**-19,
                "ckks_flooding_security_bits": 40,
            },
            "ckks-flooding-below-error",
        ),
        (
            {
                "flood_std": 2.0**-10,
                "ckks_decryption_error": 2.0**-19,
                "ckks_flooding_unsafe_for_tests": True,
            },
            "ckks-flooding-unsafe",
        ),
    ],
)
def test_ckks_flooding_is_checked(flooding, code):
    assert code in audit({"transport": "ckks", **flooding}).codes
    fine = {"transport": "ckks", "flood_std": 2.0**-10, "ckks_decryption_error": 2.0**-19}
    assert audit(fine).codes == []


@pytest.mark.parametrize("name", transport_names())
def test_every_key_securefeds_transports_record_is_known(name):
    availability = {a.name: a for a in available_transports()}[name]
    if not availability.available:
        pytest.skip(availability.reason)
    options = {"noise_multiplier": 1.0, "delta": 1e-5} if "dp" in option_groups(name) else None
    if name == "ckks+dp":  # it has no default mechanism: the float one, chosen
        options["mechanism"] = "gaussian"
    transport = build_transport(name, options, n_clients=4, total_rounds=1)
    view = _one_round(transport, SeedTree(0), clients=4)
    unknown = {*view.public, *(k for r in view.rounds for k in r.public)} - KNOWN_KEYS
    assert not unknown, f"{name} records keys the audit does not know: {sorted(unknown)}"
    assert "unknown-key" not in audit(view).codes


def _distributed_dp_round(sample_rate):
    from securefed.privacy import PrivacyLedger
    from securefed.transport.dp import DPTransport

    dp = DPTransport(
        SecAggTransport(SecAggConfig(clip=4.0)),
        clip=1.0,
        noise_multiplier=1.0,
        placement="distributed",
        ledger=PrivacyLedger(),
        sample_rate=sample_rate,
        delta=1e-5,
    )
    _one_round(dp, SeedTree.secure_mode(), clients=6)
    return dp.view


def test_assert_ok_holds_the_epsilon_against_the_server_too():
    # Item 2's exploit: under distributed DP the server picks the clients, so the epsilon
    # amplified by sampling (q = 0.06) is not the guarantee against it.
    report = audit(_distributed_dp_round(0.06))
    assert report.epsilon_against("server") > 2 * report.epsilon
    cap = 1.01 * report.epsilon
    report.assert_ok(max_epsilon=cap, against=["released_model"])
    with pytest.raises(AssertionError, match="against the server"):
        report.assert_ok(max_epsilon=cap)  # both observers by default


def test_central_dp_asserts_nothing_against_the_server():
    from securefed.privacy import PrivacyLedger
    from securefed.transport.dp import DPTransport

    dp = DPTransport(
        PlaintextTransport(), clip=1.0, noise_multiplier=1.0, ledger=PrivacyLedger(), delta=1e-5
    )
    declare_uploads(dp, protocol="sum-of-quarters", reveals=[])
    report = audit(_one_round(dp, SeedTree.secure_mode()))
    assert report.epsilon_against("server") == float("inf") and report.ok
    report.assert_ok(max_epsilon=100, against=["released_model"])
    with pytest.raises(AssertionError, match="against the server"):
        report.assert_ok(max_epsilon=100)
