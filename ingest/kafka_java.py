"""Spark's Kafka reader's client properties (the Java client's), derived from the worker's
librdkafka properties, so that the reader reaches and authenticates to the brokers exactly as
the worker's group member, admin client and validator do.

What is derived (librdkafka -> Java):
- ``security.protocol`` and ``client.id``: the same;
- ``sasl.mechanism(s)``: ``sasl.mechanism``; ``sasl.username`` / ``sasl.password`` under PLAIN
  or SCRAM-SHA-256/512: ``sasl.jaas.config`` (PlainLoginModule / ScramLoginModule); GSSAPI's
  ``sasl.kerberos.service.name``, ``.principal`` and ``.keytab``: ``sasl.kerberos.service.name``
  and a Krb5LoginModule ``sasl.jaas.config``; OAUTHBEARER with ``sasl.oauthbearer.method=oidc``
  (client id and secret, token endpoint, scope, extensions): Kafka's OAuthBearerLoginModule and
  its login callback handler;
- ``ssl.ca.location`` / ``ssl.ca.pem``: the certificates themselves, inline
  (``ssl.truststore.type=PEM``, ``ssl.truststore.certificates``); ``probe``: the JVM's default;
- ``ssl.certificate.location|pem`` and ``ssl.key.location|pem`` (+ ``ssl.key.password``):
  inline as well (``ssl.keystore.type=PEM``, ``ssl.keystore.certificate.chain``,
  ``ssl.keystore.key``), the key decrypted and rewritten as unencrypted PKCS#8, the one PEM key
  form every Java client reads (:func:`pkcs8_key`);
- ``ssl.keystore.location`` / ``ssl.keystore.password`` (PKCS#12, + ``ssl.key.password``): the
  same, type PKCS12 (the path is read by the executors: under a cluster or Spark Connect it must
  exist there);
- ``ssl.endpoint.identification.algorithm``: ``https``, or ``none`` as the Java client's empty value.

The worker reads the certificate and key files once, at start, and hands their contents to the
reader: no file needs to exist on the executors, whether Spark is local, a cluster or a Spark
Connect server. Spark's plans hide these options (``ingest.spark.session.BASE_CONF``'s
``spark.sql.redaction.options.regex``) and the Java client logs them as ``[hidden]``.

Any other security property (a name with an ``ssl``, ``sasl`` or ``https`` part) has no derived
equivalent and is a ConfigError naming it, unless Spark's reader is given its own: every
``INGEST_SPARK_KAFKA_PROP_<NAME>`` (Java client names; ``_FILE`` reads the value from a file) is
applied last, and one named like the refused property (empty: nothing) says that the reader
needs no equivalent. Properties that only tune librdkafka (timeouts, queues, debug) are not
passed on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from ingest.errors import ConfigError
from ingest_common.redact import is_secret_name

JAVA_PROP_PREFIX = "INGEST_SPARK_KAFKA_PROP_"
#: Java client properties that hold a secret without naming one (their values are redacted).
JAVA_SECRET_PROPERTIES = frozenset({"sasl.jaas.config", "ssl.keystore.key"})

_SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    **dict.fromkeys(_SCRAM, "org.apache.kafka.common.security.scram.ScramLoginModule"),
}
_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_OAUTH_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
_KRB5_MODULE = "com.sun.security.auth.module.Krb5LoginModule"
# librdkafka-only: how librdkafka runs kinit. The Java client logs in from the keytab itself.
_LIBRDKAFKA_ONLY = frozenset({"sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin"})

ReadFile = Callable[[str, str], str]


def is_security_property(name: str) -> bool:
    """Whether a librdkafka property bears on how the client reaches or authenticates to the
    brokers (``ssl.*``, ``sasl.*``, ``enable.ssl.certificate.verification``, ``https.ca.location``)."""
    return bool({"ssl", "sasl", "https"} & set(name.split(".")))


def read_client_file(name: str, path: str) -> str:
    """A certificate or key file a property names; a ConfigError naming the property."""
    if os.path.isdir(path):
        raise ConfigError(
            f"{name}={path}: a directory; Spark's Kafka reader (the Java client) takes one PEM file:"
            f" give one, or set the reader's own with {JAVA_PROP_PREFIX}*"
        )
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not PEM text"
        raise ConfigError(f"{name}: cannot read {path}: {reason}") from exc


def pkcs8_key(pem: str, password: str | None) -> str:
    """A PEM private key as the Java client reads it: PKCS#8, unencrypted. Kafka's PEM key
    store reads no PKCS#1 key (``BEGIN RSA PRIVATE KEY``) and, on Java 17, no PBES2-encrypted
    one (what ``openssl pkcs8 -topk8`` writes); librdkafka reads them all. The key is decrypted
    here with ``ssl.key.password``: it reaches Spark's reader as secret as the pair would."""
    from cryptography.hazmat.primitives import serialization

    # librdkafka ignores a password given for a key that is not encrypted: so does this.
    secret = password.encode() if password is not None and "ENCRYPTED" in pem else None
    try:
        key = serialization.load_pem_private_key(pem.encode(), secret)
    except (ValueError, TypeError) as exc:
        # The library's text names the cause (a wrong password, no password for an encrypted
        # key, not a key) and never the key.
        raise ConfigError(f"ssl.key.location/ssl.key.pem: cannot read the private key: {exc}") from exc
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")


def jaas_quote(value: str) -> str:
    """A JAAS option value: double-quoted, with ``\\`` and ``"`` escaped (the Java client's
    JAAS parser reads C-style escapes inside quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _jaas(module: str, options: Mapping[str, str]) -> str:
    body = " ".join(f"{key}={jaas_quote(value)}" for key, value in options.items())
    return f"{module} required {body};" if body else f"{module} required;"


class _Mapping:
    """One derivation: the librdkafka properties read, the Java ones made."""

    def __init__(self, props: Mapping[str, str], read: ReadFile) -> None:
        self.props = props
        self.read = read
        self.taken: set[str] = set()
        self.out: dict[str, str] = {}
        # Why the reader needs a login of its own (INGEST_SPARK_KAFKA_PROP_SASL_JAAS_CONFIG), if it does.
        self.login_needed: str | None = None

    def take(self, name: str) -> str | None:
        self.taken.add(name)
        return self.props.get(name)

    def refuse(self, name: str, why: str) -> ConfigError:
        return ConfigError(
            f"{name}: {why}; set what Spark's Kafka reader (the Java client) uses instead with"
            f" {JAVA_PROP_PREFIX}* (see docs/configuration.md#secured-brokers)"
        )

    def sasl(self) -> None:
        mechanism = (self.take("sasl.mechanism") or self.take("sasl.mechanisms") or "GSSAPI").upper()
        self.take("sasl.mechanisms")
        self.out["sasl.mechanism"] = mechanism
        username, password = self.take("sasl.username"), self.take("sasl.password")
        if mechanism in _LOGIN_MODULES:
            if username is not None or password is not None:
                self.out["sasl.jaas.config"] = _jaas(
                    _LOGIN_MODULES[mechanism], {"username": username or "", "password": password or ""}
                )
        elif mechanism == "GSSAPI":
            self._kerberos()
        elif mechanism == "OAUTHBEARER":
            self._oauthbearer()

    def _kerberos(self) -> None:
        service = self.take("sasl.kerberos.service.name")
        if service is not None:
            self.out["sasl.kerberos.service.name"] = service
        principal, keytab = self.take("sasl.kerberos.principal"), self.take("sasl.kerberos.keytab")
        if keytab is not None:
            options = {"useKeyTab": "true", "storeKey": "true", "keyTab": keytab}
            if principal is not None:
                options["principal"] = principal
            self.out["sasl.jaas.config"] = _jaas(_KRB5_MODULE, options)

    def _oauthbearer(self) -> None:
        method = (self.take("sasl.oauthbearer.method") or "default").lower()
        if method != "oidc":
            self.login_needed = (
                "with sasl.oauthbearer.method=default the token comes from INGEST_KAFKA_OAUTH_CB"
                " (or is unsecured): Spark's Kafka reader needs a login of its own"
            )
            return
        endpoint = self.take("sasl.oauthbearer.token.endpoint.url")
        if endpoint is not None:
            self.out["sasl.oauthbearer.token.endpoint.url"] = endpoint
        self.out["sasl.login.callback.handler.class"] = _OAUTH_HANDLER
        options = {}
        for name, option in (("client.id", "clientId"), ("client.secret", "clientSecret"), ("scope", "scope")):
            value = self.take(f"sasl.oauthbearer.{name}")
            if value is not None:
                options[option] = value
        extensions = self.take("sasl.oauthbearer.extensions")
        for pair in (extensions or "").split(","):
            key, sep, value = pair.strip().partition("=")
            if sep:
                options[f"extension_{key.strip()}"] = value.strip()
        self.out["sasl.jaas.config"] = _jaas(_OAUTH_MODULE, options)

    def ssl(self) -> None:
        ca = self._pem("ssl.ca.location", "ssl.ca.pem", allow_probe=True)
        if ca is not None:
            self.out.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": ca})
        certificate = self._pem("ssl.certificate.location", "ssl.certificate.pem")
        key = self._pem("ssl.key.location", "ssl.key.pem")
        key_password = self.take("ssl.key.password")
        if certificate is not None and key is not None:
            self.out.update(
                {
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.certificate.chain": certificate,
                    "ssl.keystore.key": pkcs8_key(key, key_password),
                }
            )
        elif certificate is not None or key is not None:
            raise ConfigError("ssl.certificate.* and ssl.key.*: a client certificate needs both, itself and its key")
        keystore = self.take("ssl.keystore.location")
        if keystore is not None:
            self.out.update({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": keystore})
            keystore_password = self.take("ssl.keystore.password")
            if keystore_password is not None:
                self.out["ssl.keystore.password"] = keystore_password
            if key_password is not None:
                self.out["ssl.key.password"] = key_password
        algorithm = self.take("ssl.endpoint.identification.algorithm")
        if algorithm is not None:
            self.out["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
        verification = self.take("enable.ssl.certificate.verification")
        if verification is not None and verification.lower() not in ("true", "1"):
            raise self.refuse(
                "enable.ssl.certificate.verification", "the Java client has no switch to trust any certificate"
            )

    def _pem(self, location: str, inline: str, allow_probe: bool = False) -> str | None:
        path, pem = self.take(location), self.take(inline)
        if pem is not None:
            return pem
        if path is None or (allow_probe and path == "probe"):
            return None
        return self.read(location, path)


def java_client_properties(
    props: Mapping[str, str], java: Mapping[str, str], read: ReadFile = read_client_file
) -> dict[str, str]:
    """Spark's reader's Kafka (Java) client properties (without the ``kafka.`` prefix): those
    derived from the librdkafka ``props``, then ``java`` (``INGEST_SPARK_KAFKA_PROP_*``; an
    empty value removes the property). ``read(property, path)``: a file's text."""
    mapping = _Mapping(props, read)
    if "security.protocol" in props:
        mapping.out["security.protocol"] = props["security.protocol"].upper()
    if "client.id" in props:
        mapping.out["client.id"] = props["client.id"]
    protocol = props.get("security.protocol", "plaintext").upper()
    if protocol.startswith("SASL"):
        mapping.sasl()
    if protocol.endswith("SSL"):
        mapping.ssl()
    if mapping.login_needed is not None and "sasl.jaas.config" not in java:
        raise mapping.refuse("sasl.mechanism=OAUTHBEARER", mapping.login_needed)
    for name in sorted(props):
        if is_security_property(name) and name not in mapping.taken and not _covered(name, protocol, java):
            raise mapping.refuse(name, "no equivalent is derived for Spark's Kafka reader")
    out = dict(mapping.out)
    for name, value in java.items():
        if value == "":
            out.pop(name, None)
        else:
            out[name] = value
    return out


def _covered(name: str, protocol: str, java: Mapping[str, str]) -> bool:
    """Whether a librdkafka security property needs no derived equivalent: the reader is given
    its own (a property of that name, or its own login, ``sasl.jaas.config``, for any ``sasl.*``
    but the mechanism), librdkafka alone reads it, or the protocol in use never reads it
    (``ssl.*`` under SASL_PLAINTEXT, ``sasl.*`` under SSL: librdkafka ignores it, so may the reader)."""
    parts = set(name.split("."))
    if name in java or name in _LIBRDKAFKA_ONLY:
        return True
    if "sasl" in parts and "sasl.jaas.config" in java and name not in ("sasl.mechanism", "sasl.mechanisms"):
        return True
    return ("sasl" in parts and not protocol.startswith("SASL")) or (
        "ssl" in parts and "sasl" not in parts and not protocol.endswith("SSL")
    )


def java_secret_values(java: Mapping[str, str]) -> list[str]:
    """The values of the reader's properties that hold secrets (for ingest_common.redact)."""
    return [v for k, v in java.items() if v and (k in JAVA_SECRET_PROPERTIES or is_secret_name(k))]
