"""Issue 33: docs/flower.md's multi-host recipe, with TLS and Flower's SuperNode authentication.

The fast tests check what :mod:`securefed.flower.credentials` writes (a CA that signed the
SuperLink's certificate for the given names, OpenSSH ECDSA key pairs that Flower's own loaders
read, private files mode 0600). ``-m slow``: a SuperLink started with TLS and
``--enable-supernode-auth`` and three SuperNodes presenting their registered keys run one round
of the FedMF app with the malicious-server secure aggregation and provisioned identities, equal to
the in-process model; a SuperNode whose key was never registered, one without a key, and one that
trusts another CA are each refused.
"""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    load_pem_private_key,
    load_ssh_private_key,
    load_ssh_public_key,
)

from securefed.flower.credentials import provision_node_keys, provision_tls, write_private
from securefed.flower.loopback import FederationCredentials, LoopbackFederation


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ca_signed_the_superlinks_certificate_for_its_names_and_keys_are_private(tmp_path):
    files = provision_tls(tmp_path / "tls", ["127.0.0.1", "superlink.example"])
    ca = x509.load_pem_x509_certificate(files.ca_certificate.read_bytes())
    link = x509.load_pem_x509_certificate(files.superlink_certificate.read_bytes())
    link.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    other = x509.load_pem_x509_certificate(
        provision_tls(tmp_path / "other", ["127.0.0.1"]).ca_certificate.read_bytes()
    )
    with pytest.raises(InvalidSignature):  # same CA name, another key
        link.verify_directly_issued_by(other)
    names = link.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["superlink.example"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not link.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = load_pem_private_key(files.superlink_key.read_bytes(), None)
    assert key.public_key() == link.public_key()
    assert _mode(files.superlink_key) == _mode(files.ca_key) == 0o600
    with pytest.raises(ValueError, match="at least one host"):
        provision_tls(tmp_path / "none", [])


def test_node_keys_are_openssh_p384_pairs_flower_reads_and_private(tmp_path):
    pairs = provision_node_keys(tmp_path / "keys", [0, 2])
    assert sorted(pairs) == [0, 2]
    public_keys = set()
    for pair in pairs.values():
        private = load_ssh_private_key(pair.private_key.read_bytes(), None)
        public = load_ssh_public_key(pair.public_key.read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert isinstance(private.curve, ec.SECP384R1) and private.public_key() == public
        assert _mode(pair.private_key) == 0o600
        public_keys.add(pair.public_key.read_bytes())
    assert len(public_keys) == 2  # one key pair per node
    with pytest.raises(ValueError, match="distinct"):
        provision_node_keys(tmp_path / "twice", [1, 1])


def test_write_private_tightens_an_existing_file(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_private(path, b"new")
    assert path.read_bytes() == b"new" and _mode(path) == 0o600


def test_a_federation_with_authentication_needs_every_nodes_key(tmp_path):
    credentials = FederationCredentials(
        tls=provision_tls(tmp_path / "tls", ["127.0.0.1"]),
        node_keys=provision_node_keys(tmp_path / "keys", [0]),
    )
    with pytest.raises(ValueError, match=r"key pair for every node; none for \[1\]"):
        LoopbackFederation(tmp_path / "federation", 2, credentials=credentials)


# ----------------------------------------------------------------------------- real processes
@pytest.mark.slow
def test_tls_and_node_authentication_carry_the_malicious_protocol_and_refuse_strangers(
    example, tmp_path
):
    """Every host's files as in docs/flower.md's recipe: the CA certificate everywhere, the
    SuperLink's certificate and key on its host, each node's authentication key and
    secure-aggregation identity on its own host, the registry and its digest on every node."""
    from test_flower_secure import provisioned_node_config

    from securefed.flower.loopback import missing_commands
    from securefed.recsys.fedmf_flower import write_fedmf_app

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    out, enrol = tmp_path / "out", tmp_path / "enrol"
    app = example.FedMFApp(
        seed=0,
        rounds=1,
        transport="secagg",
        min_nodes=3,
        synthetic_users=30,
        output_dir=str(out),
        timeout=120.0,
    )
    assert app.secagg_server == "malicious"  # the default the round must carry
    node_config = provisioned_node_config(enrol, 30, 3)
    credentials = FederationCredentials(
        tls=provision_tls(tmp_path / "tls", ["127.0.0.1", "localhost"]),
        node_keys=provision_node_keys(tmp_path / "node-keys", range(3)),
    )
    stranger = provision_node_keys(tmp_path / "stranger", [0])[0]
    wrong_ca = provision_tls(tmp_path / "wrong-ca", ["127.0.0.1", "localhost"]).ca_certificate
    with LoopbackFederation(
        tmp_path / "federation", 3, node_config=node_config, credentials=credentials
    ) as federation:
        refused = {
            name: federation.probe_supernode(
                name, federation.supernode_command(0, max_retries=0, **flags)
            )
            for name, flags in {
                "unregistered-key": {
                    "root_certificates": credentials.tls.ca_certificate,
                    "private_key": stranger.private_key,
                },
                "no-key": {
                    "root_certificates": credentials.tls.ca_certificate,
                    "private_key": None,
                },
                "wrong-ca": {
                    "root_certificates": wrong_ca,
                    "private_key": credentials.node_keys[0].private_key,
                },
            }.items()
        }
        federation.submit(write_fedmf_app(tmp_path / "app", app.run_config()))
        federation.wait_for(out / "result.json", timeout=400)
        # What Flower does not protect (docs/flower.md, "Limits"): its open-source Control API
        # has no account authentication, so whoever reaches the SuperLink's port and holds the
        # (public) CA certificate registers a key of its own. If Flower ever refuses this, the
        # recipe's limit is stale: this line fails.
        self_enrolled = provision_node_keys(tmp_path / "self-enrolled", [0])[0]
        assert federation.register_node(self_enrolled.public_key) > 0
        superlink_log = federation.logs[0].read_text(errors="replace")
    assert "Uvicorn running on https://127.0.0.1" in superlink_log  # TLS, not --insecure
    for name, (returncode, _) in refused.items():
        assert returncode != 0, name
    # A node presenting a key the operator never registered: refused at activation.
    assert "Failed to activate SuperNode" in refused["unregistered-key"][1]
    assert "No SuperNode found with the given public key" in superlink_log
    # A node with no key would register itself; --enable-supernode-auth forbids that (without
    # the flag it is let in: measured, docs/flower.md).
    assert "SuperNode authentication is enabled" in refused["no-key"][1]
    assert "CERTIFICATE_VERIFY_FAILED" in refused["wrong-ca"][1]
    for name in ("unregistered-key", "no-key"):
        assert "CERTIFICATE_VERIFY_FAILED" not in refused[name][1]  # the TLS handshake held
    result = json.loads((out / "result.json").read_text())
    model, _, _ = example.in_process(app)
    # Same fixed-point sums of the same users: the tolerance of test_flower.py's secagg check.
    np.testing.assert_allclose(np.load(out / "server.npz")["V"], model.V, rtol=0, atol=1e-9)
    assert result["nodes"] == 3  # the refused nodes never joined
