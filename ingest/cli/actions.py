"""``ingest suspend | resume | drain``, ``reset``, ``terminate`` and ``gc``: what operators change
about a source (its desired state, its stored offsets, its files). Drain and terminate wait
until every live worker reports drained, saying what they still wait for."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ingest.cli.common import emit, load_settings
from ingest.config import Settings, non_negative_seconds
from ingest.errors import ConfigError
from ingest.ops.status_text import dash
from ingest_common.backoff import Backoff
from ingest_common.model import DesiredState, PartitionReset, TopicPartition, WorkerState
from metastore import Metastore

# How often drain and terminate say what they are still waiting for.
PROGRESS_EVERY_S = 5.0
# How often they read the workers' states meanwhile.
DRAIN_POLL = Backoff.fixed(0.5)


def _timeout(args: argparse.Namespace) -> float:
    """``--timeout``: a positive, finite number of seconds (0, -5 or nan would never or always time out)."""
    seconds = non_negative_seconds("--timeout", args.timeout)
    if seconds == 0:
        raise ConfigError(f"--timeout: expected a positive number of seconds, got {args.timeout!r}")
    return seconds


def _wait_drained(store: Metastore, source: str, timeout_s: float, what: DesiredState, progress: TextIO) -> list[str]:
    """Wait until every live worker of ``source`` reports drained, saying every few seconds
    which are not; returns those still not drained at the timeout (empty: all drained)."""
    clock = DRAIN_POLL.clock
    deadline = clock.monotonic() + timeout_s
    next_progress = clock.monotonic() + PROGRESS_EVERY_S
    for delay in DRAIN_POLL.delays():
        pending = [
            f"{w['worker']} ({w['state']})" for w in store.live_workers(source) if w["state"] != WorkerState.DRAINED
        ]
        now = clock.monotonic()
        if not pending or now >= deadline:
            return pending
        if now >= next_progress:
            print(
                f"source {source}: {what}: waiting for {len(pending)} worker(s): {', '.join(pending)} "
                f"({deadline - now:.0f} s left)",
                file=progress,
                flush=True,
            )
            next_progress = now + PROGRESS_EVERY_S
        DRAIN_POLL.sleep(delay)
    raise AssertionError("unreachable: the backoff never ends")


def _progress(args: argparse.Namespace) -> TextIO:
    """Where lines written while waiting go: stdout, or stderr under --json (stdout is the document)."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def cmd_control(args: argparse.Namespace) -> int:
    """suspend / resume / drain: set the source's desired state; workers act within seconds."""
    state = {"suspend": DesiredState.SUSPENDED, "resume": DesiredState.RUNNING, "drain": DesiredState.DRAINING}[
        args.command
    ]
    timeout_s = _timeout(args) if args.command == "drain" else 0.0
    settings = load_settings()
    with Metastore(settings.database_url) as store:
        store.set_control(args.source, state, stay=getattr(args, "stay", False))
        print(f"source {args.source}: desired state {state}", file=_progress(args), flush=True)
        if args.command != "drain":
            emit(args, {"source": args.source, "desired_state": state})
            return 0
        pending = _wait_drained(store, args.source, timeout_s, DesiredState.DRAINING, _progress(args))
    emit(
        args,
        {"source": args.source, "desired_state": state, "drained": not pending, "pending": pending},
        [] if pending else [f"source {args.source}: drained (every fetched record published)"],
    )
    if pending:
        print(
            f"ingest: error: drain of {args.source} timed out after {timeout_s:g} s; still draining: "
            + ", ".join(pending),
            file=sys.stderr,
        )
        return 1
    return 0


def _reset_targets(
    to: str, rows: list[dict[str, Any]], settings: Settings
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """``--to`` as offsets per partition, and Kafka's low watermarks where known."""
    from ingest.config import is_digits
    from ingest.errors import ConfigError, KafkaUnavailable
    from ingest.ops.status import watermarks

    tps = [TopicPartition(r["topic"], r["partition"]) for r in rows]
    if not tps:
        raise ConfigError("the source has no partitions yet (a worker registers them when it starts)")
    logical = to in ("earliest", "latest")
    # Never-published partitions would start from Kafka's earliest: the plan needs it to say what is skipped.
    asked = tps if logical else [TopicPartition(r["topic"], r["partition"]) for r in rows if r["next_offset"] is None]
    marks = watermarks(settings, [(tp.topic, tp.partition) for tp in asked])
    earliest = {tp: marks[(tp.topic, tp.partition)][0] for tp in asked if (tp.topic, tp.partition) in marks}
    if logical:
        if len(marks) != len(tps):
            raise KafkaUnavailable(
                f"--to {to} needs Kafka's watermarks, but Kafka at {settings.kafka_bootstrap!r} "
                "did not answer; give explicit offsets (TOPIC:PARTITION=OFFSET)"
            )
        return {tp: marks[(tp.topic, tp.partition)][0 if to == "earliest" else 1] for tp in tps}, earliest
    topics = sorted({tp.topic for tp in tps})
    targets: dict[TopicPartition, int] = {}
    for item in to.split(","):
        where, sep, offset = item.strip().rpartition("=")
        topic, colon, partition = where.rpartition(":")
        if not colon and len(topics) == 1:
            topic = topics[0]
        if not sep or not topic or not is_digits(partition) or not is_digits(offset):
            raise ConfigError(f"--to: expected earliest, latest or TOPIC:PARTITION=OFFSET,... got {item!r}")
        targets[TopicPartition(topic, int(partition))] = int(offset)
    return targets, earliest


def cmd_reset(args: argparse.Namespace) -> int:
    """Set stored offsets (audited); workers drop what they hold for those partitions and re-seek."""
    import getpass
    import socket

    from ingest.errors import ResetNotConfirmed
    from ingest.ops.status import topic_ids

    settings = load_settings()
    with Metastore(settings.database_url) as store:
        store.latest_spec(args.source)  # SourceNotFound for an unknown source
        rows = store.partitions(args.source)
        # The topics' ids (KIP-516), stored with the new offsets, asked before the watermarks: a
        # topic re-created in between then reads as re-created again, never the other way.
        ids = topic_ids(settings, sorted({r["topic"] for r in rows}))
        targets, earliest = _reset_targets(args.to, rows, settings)
        actor = f"{getpass.getuser()}@{socket.gethostname()}"
        result = store.reset_offsets(
            args.source,
            targets,
            actor=actor,
            reason=args.reason,
            target=args.to,
            confirmed=args.yes,
            earliest=earliest,
            topic_ids=ids,
        )
    if not result.partitions:
        emit(
            args,
            {"source": args.source, "reset_id": None, "partitions": []},
            [f"source {args.source}: nothing to reset (stored offsets already there)"],
        )
        return 0
    if result.reset_id is None:
        effects = "; ".join(f"{p.tp} {_reset_effect(p)}" for p in result.partitions if p.replayed or p.skipped)
        raise ResetNotConfirmed(
            f"reset of {args.source} would change what is published ({effects}); "
            "nothing changed: re-run with --yes to apply"
        )
    lines = [f"source {args.source}: reset #{result.reset_id} by {actor}"]
    lines += [
        f"  {p.tp}: {dash(p.old_offset)} -> {p.new_offset} (serial {p.old_serial} -> {p.new_serial})"
        + (f", {_reset_effect(p)}" if _reset_effect(p) else "")
        for p in result.partitions
    ]
    partitions = [
        {
            "topic": p.tp.topic,
            "partition": p.tp.partition,
            "old_offset": p.old_offset,
            "new_offset": p.new_offset,
            "old_serial": p.old_serial,
            "new_serial": p.new_serial,
            "replayed": p.replayed,
            "skipped": p.skipped,
        }
        for p in result.partitions
    ]
    emit(args, {"source": args.source, "reset_id": result.reset_id, "actor": actor, "partitions": partitions}, lines)
    return 0


def _reset_effect(p: PartitionReset) -> str:
    if p.replayed:
        return f"replays [{p.replayed[0]}, {p.replayed[1]})"
    if p.skipped:
        return f"skips [{p.skipped[0]}, {p.skipped[1]})"
    return ""


def cmd_terminate(args: argparse.Namespace) -> int:
    """Drain every worker (they publish what they hold and exit), then mark the source terminated."""
    timeout_s = _timeout(args)
    with Metastore(load_settings().database_url) as store:
        if store.control(args.source).terminated:
            emit(
                args,
                {"source": args.source, "state": "terminated", "already": True},
                [f"source {args.source}: already terminated"],
            )
            return 0
        store.set_control(args.source, DesiredState.TERMINATING)
        print(
            f"source {args.source}: terminating (workers publish what they hold and exit)",
            file=_progress(args),
            flush=True,
        )
        pending = _wait_drained(store, args.source, timeout_s, DesiredState.TERMINATING, _progress(args))
        if pending:
            emit(args, {"source": args.source, "state": "terminating", "pending": pending})
            print(
                f"ingest: error: terminate of {args.source} timed out after {timeout_s:g} s; still draining: "
                + ", ".join(pending)
                + " (the source stays terminating; re-run to wait again)",
                file=sys.stderr,
            )
            return 1
        if not store.mark_terminated(args.source):
            # Another terminate finished first (fine), or the state was changed under us (by a
            # release that let other controls override terminating): never claim what is not so.
            state = store.control(args.source).desired_state
            if state is not DesiredState.TERMINATED:
                emit(args, {"source": args.source, "state": state, "pending": []})
                print(
                    f"ingest: error: source {args.source} was not terminated: its state changed to {state} "
                    "while its workers drained",
                    file=sys.stderr,
                )
                return 1
    emit(
        args,
        {"source": args.source, "state": "terminated", "already": False},
        [f"source {args.source}: terminated (segments, status and history stay queryable)"],
    )
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from ingest.ops.gc import MIN_GRACE_S, collect_garbage

    grace = non_negative_seconds("--grace", args.grace)
    if grace < MIN_GRACE_S and not (args.force or args.dry_run):
        raise ConfigError(
            f"--grace {grace:g} is below {MIN_GRACE_S:g} s: splits that running workers are still "
            "building or publishing would be abandoned and read again; add --force if the source's "
            "workers are stopped or that is intended (or look with --dry-run)"
        )
    with Metastore(load_settings().database_url) as store:
        store.latest_spec(args.source)  # SourceNotFound for an unknown source
        result = collect_garbage(store, args.source, grace_s=grace, dry_run=args.dry_run)
    would = "would " if args.dry_run else ""
    emit(
        args,
        {
            "source": args.source,
            "dry_run": args.dry_run,
            "grace_s": grace,
            "abandoned": result.abandoned,
            "deleted": list(result.deleted),
            "swept": result.swept,
            "kept": result.kept,
            "unswept": result.unswept,
            "open": result.open,
            "building": result.building,
            "unsafe": list(result.unsafe),
            "uncommitted_jobs": result.uncommitted_jobs,
            "multipart_uploads": result.multipart_note,
            "replaced_deleted": result.replaced,
            "replaced_waiting": result.replaced_waiting,
            "dirs_removed": list(result.dirs_removed),
        },
        [
            f"{would}abandon{'' if would else 'ed'} {result.abandoned} split(s) older than the grace period; "
            f"{would}delete{'' if would else 'd'} {len(result.deleted)} file(s) of {result.swept} build(s); "
            f"kept {result.kept} published file(s); {result.building} build(s) wait for splits still building, "
            f"{result.open - result.building} for a sweep once their registration or last sweep is older "
            "than the grace period",
            *(
                [
                    f"{would}delete{'' if would else 'd'} the files of {result.replaced} replaced segment(s); "
                    f"{result.replaced_waiting} replaced segment(s) wait for the grace period"
                ]
                if result.replaced or result.replaced_waiting
                else []
            ),
            *(
                [f"found {result.uncommitted_jobs} build(s) with an uncommitted S3A magic-committer job"]
                if result.uncommitted_jobs
                else []
            ),
            *([f"s3a store: {result.multipart_note}"] if result.multipart_note else []),
        ],
    )
    for problem in result.unsafe:
        print(f"gc: not swept, {problem}", file=sys.stderr)
    return 1 if result.unsafe else 0
