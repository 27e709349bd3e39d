"""bench.profiling.jfr_top on a real Flight Recorder recording: every frame of a deep stack is read, not
only the innermost five ``jfr print`` keeps unless told otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.profiling.jfr_top import parse, read_recording, summarize
from ingest_dev.java import find_java

# A thread busy 30 calls below its outermost frame (Deep.outer), for about 2 s.
DEEP = """
public class Deep {
    static volatile long sink;
    static void down(int n, long until) {
        if (n > 0) { down(n - 1, until); return; }
        long x = 0;
        while (System.nanoTime() < until) {
            for (int i = 0; i < 1_000_000; i++) { x = x * 31 + i; }
        }
        sink = x;
    }
    static void outer(long until) { down(30, until); }
    public static void main(String[] args) { outer(System.nanoTime() + 2_000_000_000L); }
}
"""


def test_the_outermost_frame_of_a_deep_stack_is_counted(tmp_path: Path) -> None:
    java = find_java(11)
    if java is None:
        pytest.fail("no JDK found: the development machine has one (scripts/setup.sh)")
    source, recording = tmp_path / "Deep.java", tmp_path / "deep.jfr"
    source.write_text(DEEP)
    subprocess.run(
        [str(java), f"-XX:StartFlightRecording=filename={recording},settings=profile", str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    samples = parse(read_recording(recording))
    # The samples taken in the busy loop (the launcher compiles Deep.java on the same thread first).
    busy = [s for s in samples if s.frames and s.frames[0] == "Deep.down"]
    assert len(busy) > 10, len(samples)
    # Each of them is 32 frames deep, Deep.outer its 32nd.
    assert all("Deep.outer" in s.frames for s in busy), [len(s.frames) for s in busy]
    assert dict(summarize(busy, match=["Deep.outer"]).inclusive) == {"Deep.outer": len(busy)}
