"""Transport credentials of a Flower deployment: a TLS CA, the SuperLink's certificate and the
SuperNodes' authentication key pairs (docs/flower.md, "As real processes on several hosts").

These protect the *channel*, not the aggregate: TLS (``flower-superlink --ssl-ca-certfile
--ssl-certfile --ssl-keyfile``, ``flower-supernode --root-certificates``) keeps a network
eavesdropper from reading the messages and a host that is not the SuperLink from posing as it;
Flower's SuperNode authentication (``flower-superlink --enable-supernode-auth``, each node's
public key registered with ``flwr supernode register``, the node started with
``--auth-supernode-private-key``) keeps a machine whose key was not registered from joining the
federation. The SuperLink's operator is the aggregation server: it still sees what the server
sees, which secure aggregation and DP bound (:mod:`securefed.flower.identity` for the
malicious-server protocol's identities, a different key set: Ed25519 per user).

:func:`provision_tls` makes the CA (``ca.key`` stays where it was made, e.g. offline) and the
SuperLink's certificate for the names and addresses it is reached at; :func:`provision_node_keys`
makes one ECDSA P-384 key pair per SuperNode in OpenSSH format, which is what Flower 1.42 reads
(``load_ssh_private_key`` on the node, ``load_ssh_public_key`` in ``flwr supernode register``).
Private files are written mode 0600 (created so, never widened); nothing secret is printed or
returned, only paths.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NodeKeyFiles",
    "TLSFiles",
    "provision_node_keys",
    "provision_tls",
    "write_private",
]

CERTIFICATE_DAYS = 365


@dataclass(frozen=True)
class TLSFiles:
    """Where :func:`provision_tls` wrote the TLS material.

    Attributes:
        ca_certificate: ``ca.crt`` (public): every SuperNode (``--root-certificates``), the
            SuperLink (``--ssl-ca-certfile``) and every ``flwr`` client (``root-certificates``).
        ca_key: ``ca.key`` (0600): signs certificates; keep it off the SuperLink host.
        superlink_certificate: ``superlink.crt`` (public): the SuperLink (``--ssl-certfile``).
        superlink_key: ``superlink.key`` (0600): the SuperLink host only (``--ssl-keyfile``).
    """

    ca_certificate: Path
    ca_key: Path
    superlink_certificate: Path
    superlink_key: Path


@dataclass(frozen=True)
class NodeKeyFiles:
    """One SuperNode's authentication key pair (ECDSA P-384, OpenSSH format).

    Attributes:
        private_key: ``supernode-<i>.key`` (0600): that node's host only
            (``flower-supernode --auth-supernode-private-key``).
        public_key: ``supernode-<i>.pub`` (public): registered at the SuperLink by its
            operator (``flwr supernode register <file> <connection>``).
    """

    private_key: Path
    public_key: Path


def write_private(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` readable by its owner only (created 0600, re-asserted).

    Args:
        path: the file (replaced if it exists).
        data: its bytes.

    Returns:
        The path.
    """
    path = Path(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)  # an existing file keeps its old mode on O_CREAT
        handle.write(data)
    return path


def _subject_alternative_names(hosts: Sequence[str]):
    from cryptography import x509

    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject, issuer, public_key, signing_key, *, ca: bool, extensions, now):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())


def provision_tls(
    directory: str | os.PathLike,
    hosts: Sequence[str],
    *,
    ca_name: str = "securefed federation CA",
) -> TLSFiles:
    """Make a CA and the SuperLink's certificate for ``hosts`` (ECDSA P-256, SHA-256).

    Args:
        directory: where to write ``ca.crt``, ``ca.key``, ``superlink.crt``, ``superlink.key``.
        hosts: the DNS names and IP addresses the SuperLink is reached at (its certificate's
            subject alternative names). On a single host include ``127.0.0.1`` and
            ``localhost``: the SuperLink's ServerApp process connects back to it over TLS too.
        ca_name: the CA's common name.

    Returns:
        The four paths (:class:`TLSFiles`).

    Raises:
        ValueError: no host given.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    hosts = [str(h) for h in hosts]
    if not hosts:
        raise ValueError("the SuperLink's certificate needs at least one host name or address")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = _name(ca_name)
    ca_certificate = _certificate(
        ca_subject,
        ca_subject,
        ca_key.public_key(),
        ca_key,
        ca=True,
        extensions=[
            (x509.KeyUsage(False, False, False, False, False, True, True, False, False), True),
            (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
        ],
        now=now,
    )
    link_key = ec.generate_private_key(ec.SECP256R1())
    link_certificate = _certificate(
        _name(hosts[0]),
        ca_subject,
        link_key.public_key(),
        ca_key,
        ca=False,
        extensions=[
            (_subject_alternative_names(hosts), False),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
        ],
        now=now,
    )

    def pem_key(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    files = TLSFiles(
        ca_certificate=out / "ca.crt",
        ca_key=out / "ca.key",
        superlink_certificate=out / "superlink.crt",
        superlink_key=out / "superlink.key",
    )
    files.ca_certificate.write_bytes(ca_certificate.public_bytes(serialization.Encoding.PEM))
    write_private(files.ca_key, pem_key(ca_key))
    files.superlink_certificate.write_bytes(
        link_certificate.public_bytes(serialization.Encoding.PEM)
    )
    write_private(files.superlink_key, pem_key(link_key))
    return files


def provision_node_keys(
    directory: str | os.PathLike, partitions: Sequence[int]
) -> dict[int, NodeKeyFiles]:
    """Make one SuperNode authentication key pair (ECDSA P-384, OpenSSH) per partition.

    Args:
        directory: where to write ``supernode-<partition>.key`` (0600) and ``.pub``.
        partitions: the partition ids of the nodes (distinct).

    Returns:
        partition -> its :class:`NodeKeyFiles`.

    Raises:
        ValueError: a partition given twice.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    partitions = [int(p) for p in partitions]
    if len(set(partitions)) != len(partitions):
        raise ValueError(f"partitions must be distinct, got {partitions}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[int, NodeKeyFiles] = {}
    for partition in partitions:
        key = ec.generate_private_key(ec.SECP384R1())
        pair = NodeKeyFiles(
            private_key=out / f"supernode-{partition}.key",
            public_key=out / f"supernode-{partition}.pub",
        )
        write_private(
            pair.private_key,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            ),
        )
        pair.public_key.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
            + b"\n"
        )
        files[partition] = pair
    return files
