"""``ingest check`` and ``ingest source apply --check`` as an operator runs them, against a real
PostgreSQL, Apache Kafka and Spark: every dependency a worker needs, one line each, the first
failure's exit code; a spec whose checks fail is not stored. (A refused SASL password:
tests/acceptance/test_secure_kafka.py, on its secured broker.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from ingest_dev.testkit import free_port
from metastore import Metastore
from tests.acceptance.harness import Produced, apply_spec, process_env, write_spec
from tests.acceptance.test_cli import ingest
from tests.fixtures.servers import MakeTopic, S3Server


def _lines(stdout: str) -> dict[str, str]:
    """Each check's line, by the check's name: ``{"kafka read": "ok      kafka read  ..."}``."""
    names = ("metastore", "kafka read", "kafka", "consumer group", "spark reader", "spark master", "schema registry")
    names += ("segment store", "table catalog", "spark")
    out = {}
    for line in stdout.splitlines():
        rest = line.split(maxsplit=1)[1] if len(line.split(maxsplit=1)) == 2 else ""
        name = next(n for n in names if rest.startswith(n + " ") or rest == n)
        out[name] = line
    return out


def test_a_sound_source_passes_every_check_and_the_spark_build_leaves_nothing(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = make_topic(partitions=3)
    produced = Produced(kafka_bootstrap, topic, 3)
    produced.produce(120)
    source, spec = write_spec(tmp_path, topic)
    apply_spec(database_url, spec)
    env = process_env(database_url, kafka_bootstrap)

    result = ingest(env, "check", source, "--spark", timeout=300)

    assert result.returncode == 0, (result.stdout, result.stderr)
    lines = _lines(result.stdout)
    assert set(lines) == {
        "metastore",
        "kafka",
        "kafka read",
        "consumer group",
        "spark reader",
        "spark master",
        "segment store",
        "spark",
    }, result.stdout
    assert all(line.startswith("ok ") for line in lines.values()), result.stdout
    assert f"{topic} (3 partitions)" in lines["kafka"]
    assert "read offset 0" in lines["kafka read"]
    assert "built 10 of the newest offsets" in lines["spark"] and "10 rows" in lines["spark"], lines["spark"]
    # The check's build and store probe are deleted; nothing was published.
    store = tmp_path / "store" / source
    assert not [p for p in store.rglob("*") if p.is_file()], list(store.rglob("*"))
    with Metastore(database_url) as db:
        assert db.segments(source) == []

    document = json.loads(ingest(env, "check", "--file", str(spec), "--json").stdout)
    assert document["ok"] is True and document["source"] == source
    assert [c["check"] for c in document["checks"]][:2] == ["metastore", "kafka"]


def test_every_broken_dependency_is_one_line_and_the_first_decides_the_exit_code(
    tmp_path: Path, database_url: str, kafka_bootstrap: str
) -> None:
    """A topic that does not exist (exit 5), a registry nobody listens on, a store under a file:
    each its own line; what needs the topic is skipped and says so."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's directory would go\n")
    registry = f"http://127.0.0.1:{free_port()}"
    _source, spec = write_spec(
        tmp_path,
        "no-such-topic",
        store=str(blocker / "store"),
        extra=f'format = "avro"\n[registry]\nurl = "{registry}"\n',
    )
    master = f"sc://127.0.0.1:{free_port()}"
    env = process_env(database_url, kafka_bootstrap, INGEST_SPARK_MASTER=master)

    result = ingest(env, "check", "--file", str(spec), "--spark", timeout=120)

    assert result.returncode == 5, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = _lines(result.stdout)
    assert lines["metastore"].startswith("ok ")
    assert lines["kafka"].startswith("FAILED ") and "topic 'no-such-topic' does not exist" in lines["kafka"]
    for skipped in ("kafka read", "consumer group", "spark"):
        assert lines[skipped].startswith("skipped ") and "the kafka check failed" in lines[skipped]
    assert lines["spark reader"].startswith("ok ")
    assert lines["spark master"].startswith("FAILED ") and master in lines["spark master"], lines["spark master"]
    assert lines["schema registry"].startswith("FAILED ") and registry in lines["schema registry"]
    assert lines["segment store"].startswith("FAILED "), lines["segment store"]
    assert len(result.stdout.splitlines()) == len(lines)  # one line per check, nothing else


def test_apply_with_check_stores_nothing_when_a_check_fails_and_stores_a_sound_spec(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    env = process_env(database_url, kafka_bootstrap)
    missing, bad = write_spec(tmp_path, "no-such-topic")

    refused = ingest(env, "source", "apply", str(bad), "--check")

    assert refused.returncode == 5, (refused.stdout, refused.stderr)
    assert "does not exist" in refused.stdout
    with Metastore(database_url) as db:
        assert missing not in [r["name"] for r in db.list_sources()]

    topic = make_topic(partitions=1)
    sound, good = write_spec(tmp_path, topic)
    stored = ingest(env, "source", "apply", str(good), "--check")
    assert stored.returncode == 0, (stored.stdout, stored.stderr)
    assert f"source {sound}: version 1" in stored.stdout and "kafka read" in stored.stdout
    with Metastore(database_url) as db:
        assert sound in [r["name"] for r in db.list_sources()]


def test_a_bucket_that_does_not_exist_fails_the_store_check_and_one_that_does_passes(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic, s3_server: S3Server
) -> None:
    """The segment store probe on S3 (moto's server): written, read and deleted under the
    source's prefix of a bucket that exists; one line and exit 1 for a bucket that does not."""
    topic = make_topic(partitions=1)
    env = process_env(database_url, kafka_bootstrap)
    _name, missing = write_spec(tmp_path, topic, store="s3a://no-such-bucket-of-ours/segments")
    _name, there = write_spec(tmp_path, topic, store=f"s3a://{s3_server.bucket}/preflight")

    refused = ingest(env, "check", "--file", str(missing))
    passed = ingest(env, "check", "--file", str(there))

    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert [line.split()[1:3] for line in refused.stdout.splitlines() if line.startswith("FAILED")] == [
        ["segment", "store"]
    ], refused.stdout
    assert passed.returncode == 0, (passed.stdout, passed.stderr)
    assert "written, read and deleted a file" in _lines(passed.stdout)["segment store"]


def test_a_pattern_source_checks_the_topics_that_match_now(
    tmp_path: Path, database_url: str, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    run = uuid.uuid4().hex[:8]
    matching = sorted(make_topic(partitions=1, prefix=f"orders.{run}") for _ in range(2))
    other = make_topic(partitions=1, prefix=f"payments.{run}")
    for topic in (*matching, other):
        Produced(kafka_bootstrap, topic, 1).produce(3)
    _source, spec = write_spec(tmp_path, "unused")
    spec.write_text(spec.read_text().replace('topics = ["unused"]', f'topic_pattern = "^orders\\\\.{run}-.*"'))

    result = ingest(process_env(database_url, kafka_bootstrap), "check", "--file", str(spec), timeout=120)

    assert result.returncode == 0, (result.stdout, result.stderr)
    lines = _lines(result.stdout)
    assert f"matches 2 topic(s): {matching[0]} (1 partitions), {matching[1]} (1 partitions)" in lines["kafka"]
    assert other not in result.stdout
    assert all(topic in lines["kafka read"] for topic in matching), lines["kafka read"]
