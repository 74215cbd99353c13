"""Certificates and keys of the test control plane: one CA, the API server's serving certificate, a client certificate
per identity, and the service-account signing key. Generated with ``cryptography`` into the cluster's directory.

Identities follow Kubernetes' conventions, so RBAC and the audit log see them as on a real cluster: the
controller-manager and the scheduler authenticate as ``system:kube-controller-manager`` / ``system:kube-scheduler``
(bound by the API server's bootstrap policy), the admin and kwok as members of ``system:masters``.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = ["Pki", "make_pki"]

_VALID = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    """Paths of everything generated; ``clients`` maps an identity name to its (cert, key)."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path  # RSA private key that signs service-account tokens
    sa_pub: Path
    clients: dict[str, tuple[Path, Path]]


def _crypto() -> None:
    """Fail with the fix when ``cryptography`` (a development dependency) is missing: the operator image ships the
    core without it and never starts a control plane."""
    try:
        import cryptography  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the local control plane needs 'cryptography' (the dev extra): pip install -e '.[dev]'"
        ) from exc


def _key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    from cryptography.hazmat.primitives import serialization

    fmt = serialization.PrivateFormat.PKCS8
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common: str, org: str | None = None) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
    )


def _leaf(
    out: Path,
    stem: str,
    subject: x509.Name,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_cert, ca_key = ca
    key = _key()
    builder = _builder(subject, ca_cert.subject, key.public_key())
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = out / f"{stem}.crt", out / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path


def make_pki(out: Path, *, service_ip: str, clients: dict[str, tuple[str, str | None]]) -> Pki:
    """Write a CA, the API server's certificate (for 127.0.0.1, localhost and the in-cluster names of the
    ``kubernetes`` Service at ``service_ip``), one client certificate per ``name -> (user, group)``, and the
    service-account key pair, into ``out``."""
    _crypto()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID

    pem = serialization.Encoding.PEM
    out.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("pipefill-devcluster-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),  # cert + CRL signing
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (out / "ca.crt").write_bytes(ca_cert.public_bytes(pem))
    _write_key(out / "ca.key", ca_key)
    ca = (ca_cert, ca_key)
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    dns.append("kubernetes.default.svc.cluster.local")
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_ip)]
    serving = _leaf(out, "apiserver", _name("kube-apiserver"), ca, ExtendedKeyUsageOID.SERVER_AUTH, sans)
    issued = {
        name: _leaf(out, name, _name(user, group), ca, ExtendedKeyUsageOID.CLIENT_AUTH)
        for name, (user, group) in clients.items()
    }
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(out / "sa.key", sa_key)
    pub = sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    (out / "sa.pub").write_bytes(pub)
    return Pki(out / "ca.crt", out / "ca.key", *serving, out / "sa.key", out / "sa.pub", issued)
