"""Certificates made at test time for the secured development broker (ingest_dev.kafka's
:class:`~ingest_dev.kafka.BrokerSecurity`): a certificate authority, the broker's certificate
(for 127.0.0.1 and localhost, so host name verification holds on both clients), a client's
certificate for mutual TLS, and a second authority nobody trusts.

Keys are EC P-256 (made in milliseconds), written as PKCS#8 PEM: librdkafka and the Java
client (Kafka's ``PEM`` key store type) both read that form. Every file is mode 0600 in a
directory of its own.

This module must not import pytest: the demo uses ingest_dev too.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_FOR = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Identity:
    """A key and its certificate, as files (PEM)."""

    key: Path
    certificate: Path


@dataclass(frozen=True)
class TestCertificates:
    """What :func:`make_certificates` wrote.

    ``ca``: the authority the broker and the clients trust. ``broker_keystore``: the broker's
    key and certificate chain in one file (Kafka's PEM key store). ``client``: a client
    certificate signed by ``ca``; ``client_encrypted_key``: the same key encrypted with
    ``client_key_password``. ``rogue_ca`` and ``rogue_client``: an authority nobody trusts,
    and a client certificate it signed."""

    ca: Path
    broker_keystore: Path
    client: Identity
    client_encrypted_key: Path
    client_key_password: str
    rogue_ca: Path
    rogue_client: Identity


def _write(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _authority(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    common_name: str,
    issuer: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    *,
    server: bool,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    issuer_key, issuer_cert = issuer
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return key, builder.sign(issuer_key, hashes.SHA256())


def make_certificates(directory: Path, client_key_password: str = "client-key-pa55") -> TestCertificates:
    """Write a fresh set of certificates under ``directory`` (created, mode 0700)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = _authority("ingest test CA")
    rogue = _authority("untrusted test CA")
    broker_key, broker_cert = _leaf("broker", ca, server=True)
    client_key, client_cert = _leaf("ingest-worker", ca, server=False)
    rogue_key, rogue_cert = _leaf("ingest-worker", rogue, server=False)
    return TestCertificates(
        ca=_write(directory / "ca.pem", _cert_pem(ca[1])),
        broker_keystore=_write(
            directory / "broker-keystore.pem", _key_pem(broker_key) + _cert_pem(broker_cert) + _cert_pem(ca[1])
        ),
        client=Identity(
            key=_write(directory / "client.key", _key_pem(client_key)),
            certificate=_write(directory / "client.pem", _cert_pem(client_cert)),
        ),
        client_encrypted_key=_write(directory / "client-encrypted.key", _key_pem(client_key, client_key_password)),
        client_key_password=client_key_password,
        rogue_ca=_write(directory / "rogue-ca.pem", _cert_pem(rogue[1])),
        rogue_client=Identity(
            key=_write(directory / "rogue-client.key", _key_pem(rogue_key)),
            certificate=_write(directory / "rogue-client.pem", _cert_pem(rogue_cert)),
        ),
    )
