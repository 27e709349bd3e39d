"""The schema registry the tests run (Apicurio Registry through its Confluent-compatible API,
ingest_dev/registry.py), driven by confluent-kafka's ``SchemaRegistryClient`` as the product
will drive it: what the Avro path relies on (ids, versions, compatibility, deletes, the wire
format) and what an outage looks like to the client. Against ``INGEST_TEST_SCHEMA_REGISTRY_URL``
the shared tests run unchanged; the outage tests always start registries of their own.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from ingest_dev.postgres import PostgresServer
from ingest_dev.registry import LocalSchemaRegistry
from ingest_dev.registry import client as registry_client

pytestmark = pytest.mark.timeout(300)

USER_V1: dict[str, Any] = {
    "type": "record",
    "name": "User",
    "namespace": "ingest.test",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
# Adds a field with a default: a reader on v2 reads v1 data (BACKWARD compatible).
USER_V2: dict[str, Any] = {
    **USER_V1,
    "fields": [*USER_V1["fields"], {"name": "email", "type": "string", "default": ""}],
}
# Adds a field without a default: a reader on it cannot read v1 data (not BACKWARD compatible).
USER_BAD: dict[str, Any] = {**USER_V1, "fields": [*USER_V1["fields"], {"name": "age", "type": "int"}]}


def avro(schema: dict[str, Any]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def subject() -> str:
    return f"t-{uuid.uuid4().hex[:12]}-value"


def client(url: str) -> SchemaRegistryClient:
    # The development client's retries: under a loaded test run Apicurio now and then never
    # answers a request (ingest_dev.registry.CLIENT_TIMEOUT_S); a retry is what a client does.
    return registry_client(url)


def outage_client(url: str) -> SchemaRegistryClient:
    # No retries: a registry that is down fails the call at once (the default retries thrice).
    return registry_client(url, **{"max.retries": 0})


def registry_error(call: Any) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as info:
        call()
    return info.value


def test_same_schema_gets_the_same_id_in_every_subject(schema_registry_url: str) -> None:
    registry = client(schema_registry_url)
    first, second = subject(), subject()
    schema_id = registry.register_schema(first, avro(USER_V1))
    assert registry.register_schema(first, avro(USER_V1)) == schema_id
    # Ids name schemas, not subjects (as in Confluent's registry): the writer's id is all a
    # reader needs, whatever subject it was registered under.
    assert registry.register_schema(second, avro(USER_V1)) == schema_id
    assert registry.register_schema(first, avro(USER_V2)) != schema_id

    fetched = client(schema_registry_url).get_schema(schema_id)
    assert fetched.schema_type == "AVRO"
    assert json.loads(fetched.schema_str) == USER_V1
    assert registry.lookup_schema(first, avro(USER_V1)).version == 1


def test_latest_version_of_a_subject(schema_registry_url: str) -> None:
    registry = client(schema_registry_url)
    name = subject()
    v1_id = registry.register_schema(name, avro(USER_V1))
    v2_id = registry.register_schema(name, avro(USER_V2))

    latest = client(schema_registry_url).get_latest_version(name)
    assert (latest.subject, latest.version, latest.schema_id) == (name, 2, v2_id)
    assert json.loads(latest.schema.schema_str) == USER_V2
    assert registry.get_version(name, 1).schema_id == v1_id
    assert registry.get_versions(name) == [1, 2]
    assert name in registry.get_subjects()


def test_backward_compatibility_refuses_an_incompatible_schema(schema_registry_url: str) -> None:
    registry = client(schema_registry_url)
    name = subject()
    registry.register_schema(name, avro(USER_V1))
    # Apicurio's global default is NONE (Confluent's is BACKWARD): set it per subject.
    assert registry.set_compatibility(name, "BACKWARD")["compatibility"] == "BACKWARD"
    assert registry.get_compatibility(name) == "BACKWARD"

    assert registry.test_compatibility(name, avro(USER_BAD)) is False
    refused = registry_error(lambda: registry.register_schema(name, avro(USER_BAD)))
    assert refused.http_status_code == 409
    assert registry.get_versions(name) == [1]

    assert registry.test_compatibility(name, avro(USER_V2)) is True
    registry.register_schema(name, avro(USER_V2))
    assert registry.get_versions(name) == [1, 2]


def own_schema() -> dict[str, Any]:
    """A schema no other subject holds: an id lives as long as any subject refers to it."""
    return {**USER_V1, "namespace": f"ingest.test.n{uuid.uuid4().hex}"}


def test_a_deleted_subject_is_not_found(schema_registry_url: str) -> None:
    registry = client(schema_registry_url)
    name, schema = subject(), own_schema()
    schema_id = registry.register_schema(name, avro(schema))
    assert registry.delete_subject(name) == [1]

    fresh = client(schema_registry_url)
    missing = registry_error(lambda: fresh.get_latest_version(name))
    assert (missing.http_status_code, missing.error_code) == (404, 40401)
    assert name not in fresh.get_subjects()
    # A soft delete keeps the id readable: records already written still decode.
    assert json.loads(fresh.get_schema(schema_id).schema_str) == schema


def test_a_permanently_deleted_schema_id_is_not_found(schema_registry_url: str) -> None:
    registry = client(schema_registry_url)
    name = subject()
    schema_id = registry.register_schema(name, avro(own_schema()))
    # Not read by id before the delete: Apicurio caches a schema read by id and keeps serving
    # it after a permanent delete, until it restarts (docs/schema-registry.md).
    assert registry.delete_subject(name) == [1]
    assert registry.delete_subject(name, permanent=True) == [1]
    gone = registry_error(lambda: client(schema_registry_url).get_schema(schema_id))
    assert (gone.http_status_code, gone.error_code) == (404, 40403)


def test_an_unknown_id_is_not_found(schema_registry_url: str) -> None:
    unknown = registry_error(lambda: client(schema_registry_url).get_schema(2_000_000_000))
    assert (unknown.http_status_code, unknown.error_code) == (404, 40403)


def test_avro_serializer_writes_the_confluent_wire_format(schema_registry_url: str) -> None:
    topic = f"t-{uuid.uuid4().hex[:12]}"
    registry = client(schema_registry_url)
    serialize = AvroSerializer(registry, json.dumps(USER_V1))
    value = serialize({"id": 7, "name": "ada"}, SerializationContext(topic, MessageField.VALUE))
    assert value is not None
    # Magic byte 0, the 4-byte big-endian id of the schema registered under <topic>-value, the body.
    schema_id = registry.get_latest_version(f"{topic}-value").schema_id
    assert value[0] == 0
    assert int.from_bytes(value[1:5], "big") == schema_id

    # A reader on v2 resolves v1 data by Avro's rules: the added field takes its default.
    deserialize = AvroDeserializer(client(schema_registry_url), json.dumps(USER_V2))
    assert deserialize(value, SerializationContext(topic, MessageField.VALUE)) == {"id": 7, "name": "ada", "email": ""}


def listening_addresses(ports: set[int]) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The local addresses of the listening TCP sockets on ``ports`` (from /proc/net/tcp*)."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text(encoding="ascii").splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port = local.split(":")
            if state != "0A" or int(port, 16) not in ports:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word of the address in host (little-endian) order.
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(packed)
            mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
            found.add(mapped or ip)
    return found


def _outage(registry: LocalSchemaRegistry) -> None:
    name = subject()
    before = outage_client(registry.url)
    schema_id = before.register_schema(name, avro(USER_V1))
    assert before.get_schema(schema_id).schema_type == "AVRO"
    port = registry.port

    registry.halt()
    # Down: a transport error, not a SchemaRegistryError (which means the registry answered).
    with pytest.raises(httpx.TransportError):
        outage_client(registry.url).get_schema(schema_id)
    with pytest.raises(httpx.TransportError):
        before.get_latest_version(name)
    # A schema the client fetched before keeps resolving from its cache.
    assert json.loads(before.get_schema(schema_id).schema_str) == USER_V1

    registry.start()
    assert registry.port == port
    after = outage_client(registry.url)
    # The storage kept everything: same id, same subject, same versions.
    assert json.loads(after.get_schema(schema_id).schema_str) == USER_V1
    assert after.get_latest_version(name).schema_id == schema_id
    assert after.register_schema(name, avro(USER_V1)) == schema_id
    assert after.register_schema(name, avro(USER_V2)) != schema_id
    assert before.get_versions(name) == [1, 2]


def test_an_outage_fails_calls_and_a_restart_keeps_every_schema(
    private_schema_registry: LocalSchemaRegistry,
) -> None:
    registry = private_schema_registry
    # Its own registry, so first what only a local one shows: it listens on loopback only.
    with urllib.request.urlopen(f"http://127.0.0.1:{registry.management_port}/health/ready", timeout=10) as resp:
        assert resp.status == 200
    # The API and the management interface; Quarkus puts the latter on 0.0.0.0 unless told.
    addresses = listening_addresses({registry.port, registry.management_port})
    assert addresses == {ipaddress.ip_address("127.0.0.1")}

    _outage(registry)


def test_the_registry_can_store_its_schemas_in_postgresql(pg_server: PostgresServer) -> None:
    name = "registry_" + uuid.uuid4().hex[:12]
    url = pg_server.create_database(name)
    registry = LocalSchemaRegistry(database_url=url)
    registry.start()
    try:
        _outage(registry)
        assert "PostgreSQL" in registry.describe()
        with psycopg.connect(url) as conn:
            tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
            row = conn.execute(tables).fetchone()
        assert row is not None and row[0] > 0, "Apicurio created no tables in PostgreSQL"
    finally:
        registry.stop()
        pg_server.drop_database(name)
