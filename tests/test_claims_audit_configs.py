"""Issue 30, item 6: configurations that are not private must be findings of the audit.

One test per case, each against what the real components record: FedRec and FedRec+ over a
transport that shows each update (their filling hides rows, not values), a model that names
itself FedMF without a variant, CKKS flooding weakened below the floor, seeded CKKS rounds driven
outside ``run_rounds``, a record marked ``tests: true``, a saved view whose digest is broken,
numbers of the wrong type or sign, and FedMF's own public keys (derived from its dataclass).
"""

from __future__ import annotations

import json
import math
from dataclasses import fields

import numpy as np
import pytest

from securefed import PlaintextTransport, SeedTree
from securefed.audit import audit
from securefed.crypto.ckks import Flooding
from securefed.errors import InsecureParameterError
from securefed.recsys.fedmf import FedMF, FedMFConfig, biased_config
from securefed.runtime import RunOptions, run_rounds
from securefed.transport import build_transport
from securefed.transport.dp import DPTransport
from securefed.views import ServerView

KEY = b"an audit key of at least 16 bytes"


def _fedmf_view(split, variant: str, transport) -> ServerView:
    model = FedMF(split.train, FedMFConfig(rounds=1, dim=4, variant=variant), SeedTree(0))
    run_rounds(model, transport, SeedTree(0), RunOptions(rounds=1, progress=False))
    return transport.view


# ----------------------------------------------------------------------------- FedRec, FedRec+
@pytest.mark.parametrize("variant", ["fedrec", "fedrec+"])
@pytest.mark.parametrize("transport", ["plaintext", "dp"])
def test_fedrec_over_a_clear_transport_is_an_error(small_split, variant, transport):
    inner = PlaintextTransport()
    carrier = (
        inner
        if transport == "plaintext"
        else DPTransport(inner, clip=1.0, noise_multiplier=1.0, delta=1e-5)
    )
    report = audit(_fedmf_view(small_split, variant, carrier))
    leak = [f for f in report.errors if f.code == "fedrec-values-leak"]
    assert leak, report.codes
    assert "rating values" in leak[0].cause


def test_fedrec_under_secure_aggregation_is_not_flagged_for_values():
    config = {"protocol": "fedmf", "variant": "fedrec", "transport": "secagg", "tests": False}
    assert "fedrec-values-leak" not in audit(config).codes


# ----------------------------------------------------------------------------- protocol names
@pytest.mark.parametrize("variant", [None, "fedmf2", ""])
def test_a_model_naming_itself_fedmf_without_a_known_variant_is_an_error(variant):
    transport = PlaintextTransport()
    transport.view.public["protocol"] = "fedmf"
    if variant is not None:
        transport.view.public["variant"] = variant
    report = audit(transport.view)
    assert "fedmf-variant-unknown" in [f.code for f in report.errors], report.codes


# ----------------------------------------------------------------------------- CKKS flooding
@pytest.mark.parametrize("bits", [1, 10, 20 - 1])
def test_flooding_below_the_floor_level_is_refused_at_construction(bits):
    with pytest.raises(InsecureParameterError, match="security_bits"):
        Flooding(security_bits=bits)
    with pytest.raises(InsecureParameterError, match=f"{20}"):
        build_transport(f"ckks:flood_security_bits={bits}", n_clients=4, total_rounds=1)


def test_the_floor_level_itself_is_accepted():
    assert Flooding(security_bits=20).security_bits == 20


def test_a_record_of_weak_flooding_is_an_error():
    """A record (of another tool, or an old version) of 1-bit flooding fails the audit even
    though its std is exactly the 1-bit floor."""
    config = {
        "transport": "ckks",
        "flood_std": 1e-6,
        "ckks_decryption_error": 1e-6,
        "ckks_flooding_security_bits": 1,
        "secure": True,
    }
    report = audit(config)
    assert "ckks-flooding-weak" in [f.code for f in report.errors], report.codes


def test_the_cli_refuses_one_bit_flooding(tmp_path, capsys):
    from securefed.bench.cli import main

    code = main(
        [
            "fedmf",
            "--transport",
            "ckks:flood_security_bits=1",
            "--rounds",
            "1",
            "--seed",
            "0",
            "--json",
            str(tmp_path / "run.json"),
        ]
    )
    assert code != 0 and not (tmp_path / "run.json").exists()
    assert "flood" in capsys.readouterr().err


# ----------------------------------------------------------------------------- seeded CKKS
def test_seeded_ckks_rounds_outside_run_rounds_fail_the_audit():
    transport = build_transport("ckks", n_clients=4, total_rounds=1)
    rnd = transport.open_round(0, range(4), shape=(2, 3), seeds=SeedTree(0))
    for client in range(4):
        rnd.submit(client, np.full(6, 0.25))
    rnd.result()
    report = audit(transport.view)
    assert "seeded-randomness" in [f.code for f in report.errors], report.codes


# ----------------------------------------------------------------------------- tests: true
def test_a_record_marked_as_a_test_run_is_an_error():
    config = {"transport": "secagg", "secure": True, "tests": True}
    report = audit(config)
    assert "test-run-record" in [f.code for f in report.errors], report.codes
    # ... and it hides nothing: a seeded test record is still seeded.
    assert "seeded-randomness" in audit({**config, "seeded": True}).codes


# ----------------------------------------------------------------------------- saved views
def _saved_view(directory, *, key=None):
    transport = PlaintextTransport()
    rnd = transport.open_round(0, range(3), shape=(1, 2), seeds=SeedTree.secure_mode())
    for client in range(3):
        rnd.submit(client, np.ones(2))
    rnd.result()
    transport.view.public.update({"uploads_reveal": [], "protocol": "mine"})
    transport.view.save(directory, key=key)
    return directory


def test_an_intact_saved_view_has_no_integrity_finding(tmp_path):
    report = audit(_saved_view(tmp_path / "view"))
    assert not [c for c in report.codes if c.startswith("view-")], report.codes


def test_a_flipped_bit_in_a_saved_views_arrays_is_an_error(tmp_path):
    path = _saved_view(tmp_path / "view")
    arrays = path / "arrays.npz"
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 1
    arrays.write_bytes(bytes(data))
    report = audit(path)
    assert "view-integrity" in [f.code for f in report.errors], report.codes


def test_an_edited_manifest_is_an_error(tmp_path):
    path = _saved_view(tmp_path / "view")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["public"]["uploads_reveal"] = []
    manifest["public"]["epsilon"] = 0.5  # a claim the run never made
    (path / "manifest.json").write_text(json.dumps(manifest))
    for source in (path, path / "manifest.json"):
        report = audit(source)
        assert "view-integrity" in [f.code for f in report.errors], report.codes


def test_a_manifest_without_its_digest_is_an_error(tmp_path):
    path = _saved_view(tmp_path / "view")
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["digest"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert "view-integrity" in audit(path).codes


def test_a_keyed_view_is_checked_with_its_key_and_unverifiable_without(tmp_path):
    path = _saved_view(tmp_path / "view", key=KEY)
    assert not [c for c in audit(path, key=KEY).codes if c.startswith("view-")]
    assert "view-integrity" in [f.code for f in audit(path).errors]
    assert "view-integrity" in audit(path, key=b"another key of 16 bytes or more").codes


# ----------------------------------------------------------------------------- types and signs
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("epsilon", -1.0),
        ("epsilon_server", -0.5),
        ("epsilon_budget", "8"),
        ("epsilon_budget", 0.0),
        ("epsilon", "2.1"),
        ("epsilon", True),
        ("delta", "1e-5"),
        ("n_users", "943"),
        ("epsilon", math.nan),
        ("epsilon_budget", math.inf),
    ],
)
def test_a_number_of_the_wrong_type_or_sign_is_an_error(key, value):
    config = {"transport": "secagg+dp", "placement": "distributed", "epsilon": 2.0, key: value}
    invalid = [f for f in audit(config).errors if f.code == "invalid-value"]
    assert invalid and key in invalid[0].cause, audit(config).codes


def test_a_string_budget_does_not_pass_as_a_number():
    """``"8"`` was read as 8 and an epsilon of 9 then failed only by luck of the comparison;
    an epsilon of 7 passed against a budget nobody set as a number."""
    report = audit({"epsilon": 7.0, "epsilon_budget": "8", "delta": 1e-5})
    assert not report.ok


# ----------------------------------------------------------------------------- FedMF's keys
def test_every_public_field_of_fedmf_config_is_a_key_the_audit_knows():
    """Derived from the dataclass: a field added to FedMFConfig is known without a list to edit."""
    config = FedMFConfig()
    for item in fields(FedMFConfig):
        report = audit({item.name: getattr(config, item.name)})
        assert "unknown-key" not in report.codes, (item.name, report.codes)


def test_a_biased_fedmf_view_needs_no_extra_keys(small_split):
    model = FedMF(small_split.train, biased_config(rounds=1, dim=4), SeedTree(0))
    transport = build_transport("secagg", n_clients=model.n_clients, total_rounds=1)
    run_rounds(model, transport, SeedTree(0), RunOptions(rounds=1, progress=False))
    report = audit(transport.view)
    assert "unknown-key" not in report.codes, [str(f) for f in report.findings]
