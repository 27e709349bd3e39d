"""One Spark in the whole repository: the pinned pyspark, the one pom of Spark jars built for its
Spark line and Hadoop version, and no other pyspark pinned anywhere (a second Spark would need a
virtualenv of its own again)."""

from __future__ import annotations

import re
import subprocess
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pyspark

from ingest.spark.jars import SPARK_JARS_POM

REPO = Path(__file__).resolve().parents[2]
NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def pinned_pyspark() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("pyspark")]
    match = re.fullmatch(r"pyspark(\[[a-z,]+\])?==(\d+\.\d+\.\d+)", pin)
    assert match, pin
    return match.group(2)


def pom_dependencies(pom: Path) -> list[tuple[str, str, str]]:
    """(groupId, artifactId, version) of each dependency, properties substituted."""
    root = ET.parse(pom).getroot()
    props = {el.tag.split("}")[1]: el.text or "" for el in root.findall("m:properties/*", NS)}

    def value(el: ET.Element, tag: str) -> str:
        text = el.findtext(f"m:{tag}", default="", namespaces=NS)
        return re.sub(r"\$\{([^}]+)\}", lambda m: props[m.group(1)], text)

    return [
        (value(d, "groupId"), value(d, "artifactId"), value(d, "version"))
        for d in root.iter(f"{{{NS['m']}}}dependency")
        if d.find("m:version", NS) is not None
    ]


def line(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_installed_pyspark_is_the_pinned_one() -> None:
    assert pyspark.__version__ == pinned_pyspark()


def test_every_spark_jar_is_built_for_the_pinned_spark_line() -> None:
    spark_line = line(pinned_pyspark())
    deps = pom_dependencies(SPARK_JARS_POM)
    spark = [(a, v) for g, a, v in deps if g == "org.apache.spark"]
    assert {a.split("_")[0] for a, _ in spark} >= {"spark-sql-kafka-0-10", "spark-avro", "spark-hadoop-cloud"}
    for artifact, version in spark:
        assert line(version) == spark_line, (artifact, version, spark_line)
    iceberg = [a for g, a, _ in deps if g == "org.apache.iceberg"]
    assert iceberg == [f"iceberg-spark-runtime-{spark_line}_2.13"]


def test_hadoop_aws_matches_the_hadoop_client_inside_the_wheel() -> None:
    # hadoop-aws of another Hadoop version fails at the first s3a:// write with missing classes.
    (aws,) = [v for g, a, v in pom_dependencies(SPARK_JARS_POM) if a == "hadoop-aws"]
    wheel_jars = Path(pyspark.__file__).parent / "jars"
    assert (wheel_jars / f"hadoop-client-api-{aws}.jar").exists(), sorted(wheel_jars.glob("hadoop-client-api-*"))


def test_no_other_pom_or_file_pins_another_spark() -> None:
    poms = sorted(p.relative_to(REPO) for p in (REPO / "scripts").glob("*/pom.xml"))
    for pom in poms:
        if REPO / pom != SPARK_JARS_POM:
            assert not [a for g, a, _ in pom_dependencies(REPO / pom) if "spark" in a], pom
    pinned = pinned_pyspark()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    pins = re.compile(r"pyspark(?:\[[a-z,]+\])?==(\d+\.\d+\.\d+)")
    for name in tracked.splitlines():
        path = REPO / name
        if path.suffix not in {".py", ".toml", ".sh", ".md", ".yml", ".yaml", ".txt", ""} or not path.is_file():
            continue
        for version in pins.findall(path.read_text(errors="replace")):
            assert version == pinned, (name, version)
