"""Secured brokers without a broker: settings read from files (``_FILE``), the Java client
properties Spark's reader derives from the worker's librdkafka ones, what counts as a refusal of
the credentials, and what is redacted. The real broker's tests: tests/acceptance/test_secure_kafka.py."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ingest.builder.kafka_read import KafkaReader
from ingest.config import Settings, admin_config, consumer_config
from ingest.errors import ConfigError
from ingest.formats.registry import RegistrySettings, registry_client
from ingest.kafka_auth import java_refusal, refusal
from ingest.kafka_java import jaas_quote, java_client_properties
from ingest.spark.session import BASE_CONF, SECRET_TEXT_PATTERN
from ingest_common import redact
from ingest_dev.certs import make_certificates

BASE = {"INGEST_DATABASE_URL": "postgresql://x@127.0.0.1:1/db", "INGEST_KAFKA_BOOTSTRAP": "k:9092"}
SCRAM = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "ingest",
    "sasl.password": "s3cret",
}


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --------------------------------------------------------------------------- settings from files


def test_secrets_are_read_from_files_without_their_line_end(tmp_path: Path) -> None:
    env = {
        "INGEST_KAFKA_BOOTSTRAP": "k:9092",
        "INGEST_DATABASE_URL_FILE": _file(tmp_path, "db", "postgresql://ingest:db-Pa55@db.example/ingest\n"),
        "INGEST_KAFKA_PROP_SECURITY_PROTOCOL": "SASL_SSL",
        "INGEST_KAFKA_PROP_SASL_PASSWORD_FILE": _file(tmp_path, "kafka", "kafka-Pa55\r\n"),
        "INGEST_SPARK_KAFKA_PROP_SASL_JAAS_CONFIG_FILE": _file(tmp_path, "jaas", "Module required secretish=1;\n"),
        "INGEST_SCHEMA_REGISTRY_USER_INFO_FILE": _file(tmp_path, "registry", "reg-user:reg-Pa55\n"),
        "INGEST_SPARK_MASTER_FILE": _file(tmp_path, "master", "sc://spark:15002/;token=t0ken-value\n"),
        # librdkafka's own ".file" properties take a path, as they are.
        "INGEST_KAFKA_PROP_SASL_OAUTHBEARER_ASSERTION_FILE": "/run/assertion.jwt",
    }
    settings = Settings.from_env(env)
    assert settings.database_url == "postgresql://ingest:db-Pa55@db.example/ingest"
    assert settings.kafka_properties["sasl.password"] == "kafka-Pa55"
    assert settings.kafka_properties["sasl.oauthbearer.assertion.file"] == "/run/assertion.jwt"
    assert settings.spark_reader_properties == {"sasl.jaas.config": "Module required secretish=1;"}
    assert settings.spark_master == "sc://spark:15002/;token=t0ken-value"
    assert consumer_config(settings, "g")["sasl.password"] == admin_config(settings)["sasl.password"] == "kafka-Pa55"
    client = registry_client(RegistrySettings("http://registry:8080"), env)
    assert client._rest_client.auth == ("reg-user", "reg-Pa55")
    # Every secret read from a file is redacted like one given inline.
    assert {"db-Pa55", "kafka-Pa55", "Module required secretish=1;", "reg-Pa55", "t0ken-value"} <= set(
        settings.secret_values()
    )
    try:
        redact.register_secrets(settings.secret_values())
        line = redact.redact("auth failed for kafka-Pa55, db-Pa55, reg-user:reg-Pa55, Module required secretish=1;")
    finally:
        redact.forget_secrets()
    assert not re.search("Pa55|secretish", line), line


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"INGEST_KAFKA_PROP_SASL_PASSWORD": "a", "INGEST_KAFKA_PROP_SASL_PASSWORD_FILE": "/x"},
            "INGEST_KAFKA_PROP_SASL_PASSWORD and INGEST_KAFKA_PROP_SASL_PASSWORD_FILE are both set",
        ),
        ({"INGEST_DATABASE_URL_FILE": "/x"}, "INGEST_DATABASE_URL and INGEST_DATABASE_URL_FILE are both set"),
        (
            {"INGEST_KAFKA_PROP_SASL_PASSWORD_FILE": "/nonexistent/pw"},
            "INGEST_KAFKA_PROP_SASL_PASSWORD_FILE: cannot read",
        ),
        ({"INGEST_SCHEMA_REGISTRY_USER_INFO_FILE": "/nonexistent/ui"}, "INGEST_SCHEMA_REGISTRY_USER_INFO_FILE: cannot"),
        ({"INGEST_KAFKA_OAUTH_CB": "no_such_module:token"}, "INGEST_KAFKA_OAUTH_CB: cannot import"),
        ({"INGEST_KAFKA_OAUTH_CB": "json"}, "INGEST_KAFKA_OAUTH_CB: expected package.module:function"),
    ],
)
def test_a_secret_setting_that_cannot_be_read_is_one_line_naming_it(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({**BASE, **env})
    assert says in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_an_oauth_callback_reaches_every_librdkafka_client() -> None:
    settings = Settings.from_env({**BASE, "INGEST_KAFKA_OAUTH_CB": "tests.unit.test_kafka_security:_token"})
    assert consumer_config(settings, "g")["oauth_cb"] is _token
    assert admin_config(settings)["oauth_cb"] is _token


def _token(_config: str) -> tuple[str, float]:
    return "token", 0.0


# --------------------------------------------------------------------------- Spark's reader's properties


def test_sasl_maps_to_a_jaas_line_with_the_password_escaped() -> None:
    password = 'pa"ss\\word'
    java = java_client_properties({**SCRAM, "sasl.password": password, "ssl.ca.location": "probe"}, {})
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="ingest"'
        ' password="pa\\"ss\\\\word";',
    }
    plain = java_client_properties({**SCRAM, "sasl.mechanisms": "PLAIN", "sasl.mechanism": "PLAIN"}, {})
    assert plain["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")
    assert jaas_quote("a\\b") == '"a\\\\b"'


def test_oidc_and_kerberos_map_to_their_login_modules() -> None:
    oidc = java_client_properties(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "client",
            "sasl.oauthbearer.client.secret": "oauth-s3cret",
            "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
            "sasl.oauthbearer.scope": "kafka",
            "sasl.oauthbearer.extensions": "logicalCluster=lkc-1, identityPoolId=pool-2",
        },
        {},
    )
    assert oidc["sasl.oauthbearer.token.endpoint.url"] == "https://idp/token"
    assert oidc["sasl.login.callback.handler.class"].endswith("oauthbearer.OAuthBearerLoginCallbackHandler")
    assert oidc["sasl.jaas.config"] == (
        'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="client"'
        ' clientSecret="oauth-s3cret" scope="kafka" extension_logicalCluster="lkc-1" extension_identityPoolId="pool-2";'
    )
    kerberos = java_client_properties(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.kerberos.service.name": "kafka",
            "sasl.kerberos.principal": "ingest@EXAMPLE",
            "sasl.kerberos.keytab": "/etc/ingest.keytab",
            "sasl.kerberos.kinit.cmd": "kinit -k",
        },
        {},
    )
    assert kerberos == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "GSSAPI",
        "sasl.kerberos.service.name": "kafka",
        "sasl.jaas.config": 'com.sun.security.auth.module.Krb5LoginModule required useKeyTab="true" storeKey="true"'
        ' keyTab="/etc/ingest.keytab" principal="ingest@EXAMPLE";',
    }


def test_certificates_and_keys_go_inline_the_key_as_unencrypted_pkcs8(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    props = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs.ca),
        "ssl.certificate.location": str(certs.client.certificate),
        "ssl.key.location": str(certs.client_encrypted_key),
        "ssl.key.password": certs.client_key_password,
        "ssl.endpoint.identification.algorithm": "none",
    }
    java = java_client_properties(props, {})
    assert java["ssl.truststore.type"] == java["ssl.keystore.type"] == "PEM"
    assert java["ssl.truststore.certificates"] == certs.ca.read_text()
    assert java["ssl.keystore.certificate.chain"] == certs.client.certificate.read_text()
    assert java["ssl.keystore.key"] == certs.client.key.read_text()  # decrypted: the same key
    assert "ssl.key.password" not in java and java["ssl.endpoint.identification.algorithm"] == ""
    # A PKCS#1 ("traditional") key, which the Java client does not read, is rewritten too.
    key = ec.generate_private_key(ec.SECP256R1())
    traditional = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    assert traditional.startswith("-----BEGIN EC PRIVATE KEY-----")
    inline = java_client_properties({**props, "ssl.key.location": "", "ssl.key.pem": traditional}, {})
    assert inline["ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----")
    with pytest.raises(ConfigError, match=r"ssl.key.location/ssl.key.pem: cannot read the private key"):
        java_client_properties({**props, "ssl.key.password": "wrong"}, {})
    with pytest.raises(ConfigError, match=r"ssl.ca.location=.*a directory"):
        java_client_properties({**props, "ssl.ca.location": str(tmp_path)}, {})
    with pytest.raises(ConfigError, match=r"ssl.ca.location: cannot read /nonexistent/ca.pem"):
        java_client_properties({**props, "ssl.ca.location": "/nonexistent/ca.pem"}, {})


def test_what_cannot_be_derived_is_refused_unless_the_reader_is_given_its_own() -> None:
    with pytest.raises(ConfigError) as refused:
        java_client_properties({**SCRAM, "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384"}, {})
    assert str(refused.value).startswith("ssl.cipher.suites: no equivalent") and "INGEST_SPARK_KAFKA_PROP_" in str(
        refused.value
    )
    own = java_client_properties(
        {**SCRAM, "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384"},
        {"ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "client.id": ""},
    )
    assert own["ssl.cipher.suites"] == "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" and "client.id" not in own
    with pytest.raises(ConfigError, match=r"enable.ssl.certificate.verification"):
        java_client_properties({**SCRAM, "enable.ssl.certificate.verification": "false"}, {})
    # Unused by the protocol in use: ignored by librdkafka, so by the reader too.
    assert "ssl.cipher.suites" not in java_client_properties(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "ssl.cipher.suites": "X"}, {}
    )
    # OAUTHBEARER from a token callback (INGEST_KAFKA_OAUTH_CB, AWS MSK IAM): the reader needs its own login.
    callback = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.config": "r=1"}
    with pytest.raises(ConfigError, match=r"sasl.mechanism=OAUTHBEARER.*a login of its own"):
        java_client_properties(callback, {})
    msk = {
        "sasl.mechanism": "AWS_MSK_IAM",
        "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
        "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
    }
    assert java_client_properties(callback, msk) == {"security.protocol": "SASL_SSL", **msk}


# --------------------------------------------------------------------------- refusals and redaction


@pytest.mark.parametrize(
    ("code", "text", "refused"),
    [
        (KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials", True),
        (KafkaError._SSL, "SSL handshake failed: certificate verify failed", True),
        (KafkaError._TRANSPORT, "Receive failed: ssl/tls alert bad certificate: SSL alert number 42", True),
        (KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:9092 failed: Connection refused", False),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down", False),
    ],
)
def test_what_is_a_refusal_of_the_credentials(code: int, text: str, refused: bool) -> None:
    assert (refusal(KafkaError(code, text)) == text) is refused


def test_the_java_clients_refusal_is_found_in_a_build_error() -> None:
    text = (
        "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors.SaslAuthenticationException:"
        " Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
    )
    assert java_refusal(text) == text.split(": ", 1)[1].removeprefix("org.apache.kafka.common.errors.")
    assert java_refusal("org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node") is None


def test_spark_redacts_the_readers_secrets_in_plan_texts() -> None:
    """What Spark Connect's operation events show of a plan: its proto text, the reader's
    options in it (``spark.sql.redaction.string.regex``, Java's regex, Python's alike here)."""
    from pyspark.sql.connect.proto import relations_pb2

    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="ingest" password="pa\\"ss";'
    key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n"
    read = relations_pb2.Read(
        data_source=relations_pb2.Read.DataSource(
            format="kafka",
            options={
                "kafka.sasl.jaas.config": jaas,
                "kafka.ssl.keystore.key": key,
                "kafka.ssl.key.password": "key-Pa55",
                "kafka.bootstrap.servers": "b:9093",
            },
        )
    )
    text = str(read)
    assert "ScramLoginModule" in text and "MIGHAgEA" in text and "key-Pa55" in text
    redacted = re.sub(SECRET_TEXT_PATTERN, "*********(redacted)", text)
    assert not re.search("ScramLoginModule|pa.{1,3}ss|MIGHAgEA|key-Pa55", redacted), redacted
    assert "b:9093" in redacted
    assert BASE_CONF["spark.sql.redaction.string.regex"] == SECRET_TEXT_PATTERN
    assert re.search(BASE_CONF["spark.sql.redaction.options.regex"], "kafka.sasl.jaas.config")


def test_the_readers_group_id_does_not_let_its_secrets_be_guessed() -> None:
    """The group id's digest shows in logs and in Kafka: a plain hash of the options would let
    a password be tested offline. Within the process the same options give the same id."""
    java = java_client_properties(SCRAM, {})
    reader = KafkaReader.of("b:9093", "ingest-s-spark", java)
    options = dict(reader.options)
    assert KafkaReader.of("b:9093", "ingest-s-spark", java).options == reader.options
    other = KafkaReader.of("b:9093", "ingest-s-spark", java_client_properties({**SCRAM, "sasl.password": "x"}, {}))
    assert dict(other.options)["kafka.group.id"] != options["kafka.group.id"]
    kafka = {
        k: v
        for k, v in options.items()
        if k.startswith("kafka.") and k not in ("kafka.group.id", "kafka.isolation.level")
    }
    plain_hash = hashlib.sha256(json.dumps(kafka, sort_keys=True).encode()).hexdigest()[:12]
    assert options["kafka.group.id"] != f"ingest-s-spark-{plain_hash}"
