"""bench.profiling.jfr_top: the shares of a recording's execution samples, from ``jfr print --json``'s shape."""

from __future__ import annotations

from typing import Any

from bench.profiling.jfr_top import Sample, parse, report, summarize


def event(thread: str, *frames: str) -> dict[str, Any]:
    return {
        "type": "jdk.ExecutionSample",
        "values": {
            "sampledThread": {"osName": thread, "javaName": thread},
            "stackTrace": {
                "truncated": False,
                "frames": [
                    {"method": {"type": {"name": name.rsplit(".", 1)[0]}, "name": name.rsplit(".", 1)[1]}}
                    for name in frames
                ],
            },
        },
    }


def test_parse_names_threads_by_pool_and_frames_innermost_first() -> None:
    recording = {
        "recording": {
            "events": [
                event("Executor task launch worker for task 3.0 in stage 7.0 (TID 12)", "a/B.c", "a/B.d"),
                {"type": "jdk.ExecutionSample", "values": {"sampledThread": None, "stackTrace": None}},
            ]
        }
    }
    assert parse(recording) == [Sample("Executor task launch worker", ("a/B.c", "a/B.d")), Sample("?", ())]


def test_self_counts_the_innermost_frame_and_inclusive_counts_a_frame_once_per_sample() -> None:
    samples = [
        Sample("t1", ("p/Dict.put", "p/Writer.write", "p/Writer.write")),  # recursion: counted once
        Sample("t1", ("p/Dict.get", "p/Writer.write")),
        Sample("t2", ("j/Json.parse",)),
        Sample("t2", ()),
    ]
    summary = summarize(samples, top=10, match=["Writer", "Json"])
    assert summary.samples == 4
    assert dict(summary.threads) == {"t1": 2, "t2": 2}
    assert dict(summary.self_frames) == {"p/Dict.put": 1, "p/Dict.get": 1, "j/Json.parse": 1}
    assert dict(summary.inclusive) == {"p/Writer.write": 2, "j/Json.parse": 1}
    text = report(summary)
    assert " 50.0 %  p/Writer.write" in text and " 25.0 %  j/Json.parse" in text
