"""Shared test configuration: server and Spark fixtures live in plugin modules."""

pytest_plugins = [
    "tests.fixtures.servers",
    "tests.fixtures.catalogs",
    "tests.fixtures.spark",
    "tests.fixtures.spark_connect",
]
