"""Exactly-once Kafka ingestion workers.

The subpackages follow the protocol: a worker consumes a source's partitions (``consume``),
builds sealed splits into Parquet files nobody sees yet (``build``) and publishes each split
with its offsets in one serial-guarded metastore transaction (``publish``); operators look
and act through ``ops`` and ``cli``; ``table`` appends published segments to Iceberg tables.

Layers, lowest first; a module imports only from its own layer and the ones below it, and
the three in one row not from each other (tests/unit/test_layers.py checks this)::

    ingest_common < metastore < ingest (shared) < splits < spark | segments < builder
        < publish | ops | table | compact < consume < ingest.worker < cli

Module map:

ingest (top level: the shared base, and the worker process that wires the layers)
    errors         the worker's exceptions under ingest_common's root (exit codes there)
    spec           source specs: the TOML parsed and validated, round-tripped through JSON
    formats        the Confluent wire format, the [registry] section, Avro reader schemas, the registry client
    avro_resolution  Avro's schema resolution rules: can a writer schema be read with a reader schema
    evolution      what ``source apply`` refuses when an Avro source's reader schema changes
    config         settings from the environment; librdkafka client configuration
    logs           structlog set-up (JSON events, redacted) and librdkafka's log bridge
    worker         one worker process: settings, metastore, Spark, pipeline, consumer, loop
    __main__       ``python -m ingest``: the command line

ingest.consume (one polling thread: the consumer group's member)
    kafka          the one boundary to confluent-kafka: typed consumer, error codes, quirks, KIP-320 validation
    loop           poll, route records into buffers, seal, pause for backpressure
    context        what the loop's parts share (LoopContext), the metastore calls and pipeline they need
    rebalance      assign / revoke / lost callbacks: claim (new serials), kill switches
    assignment     the partitions owned now, each one's lifecycle as a state machine
    positioning    the one repositioning path (rewind, reset, skipped gap, resume)
    outcomes       what a finished split does: offsets, fence or rewind, health
    gaps           offsets gone from the log (retention, truncation): measured, recorded, skipped or stopped
    controls       suspend, drain, resume, resets and spec versions, as a worker applies them
    heartbeats     the worker's registry entry: heartbeats, controls read, error reports
    background     the thread every metastore call outside a rebalance callback runs on
    group_offsets  published offsets committed to the group as advice for Kafka's tools
    loop_metrics   lag and the loop's gauges
    publish_watch  a publish unfinished past its bound makes the worker unhealthy
    registry_watch partitions waiting for the schema registry: paused, reported (readyz, status, metrics)

ingest.splits (the hand-off types of a split's journey: consume -> build -> publish)
    split          per-partition buffers, sealed splits, kill switches, records made in memory
    chunks         consumed records as Arrow chunks: what buffers and splits hold, sliced at split boundaries

ingest.spark (a role's Spark session and what it runs on)
    session        the worker's one SparkSession (local, standalone or Spark Connect)
    connect        the Spark Connect session: bounded client retries, re-created when the server lost it
    jars           where the pinned Spark jars are (S3, Kafka source, Avro, Iceberg, JDBC)

ingest.segments (segment files: where they live, which split each belongs to)
    store          the store's layout and file operations (file://, s3a://, ...)
    output_files   which split each output file belongs to, from its footers

ingest.builder (sealed splits into Parquet files, invisible until published)
    job            the Spark job over a batch of splits: stage, parse, write, account
    registration   every build registered in the metastore before it writes
    plan           the staged files' layout and the expressions that parse them
    writer_schemas a batch's Avro and Protobuf writer schemas, fetched from the registry once and cached
    protobuf_writers a Protobuf writer schema's FileDescriptorProtos and imports, from the registry
    protobuf_decode the Confluent Protobuf framing, decoded in Spark's Python workers (mapInArrow)

ingest.publish (built splits made visible, in offset order per partition)
    pipeline       concurrent batched builds, in-order publishes, outcomes for the loop
    settle         one built split published or not, the outcome types, who may delete its files
    publisher      the serial-guarded publish transaction, retried, never twice
    registry_wait  splits waiting for the schema registry: their partitions, since when, its last error

ingest.ops (what operators see and run; reads the metastore, never the worker's runtime)
    metrics        every metric the worker exports
    endpoints      /metrics, /healthz and /readyz on the metrics port
    status         ``ingest status`` / ``segments`` / ``gaps``: the document (``--json``)
    status_text    the status document as text: tables and one line per problem
    history        ``ingest source history``: spec versions and what changed
    gc             garbage collection of the segment store, decided by the metastore
    audit          ``ingest audit``: offsets tiled by current segments and skipped gaps; files' footers

ingest.table (published segments as Iceberg tables, each appended exactly once)
    committer      the table committer: reconcile, choose a batch, append (or replace), record
    replacement    a compaction's replacement as one Iceberg overwrite snapshot: held files out, new in
    properties     the table properties the committer keeps (commit seq, segments) and the head check
    runner         the long-running role: one active per source (a lock), standbys, retries
    enable         ``ingest table-enable``: a source's tables on (no pyiceberg needed)
    health         the committer's /healthz and /readyz: failing, hung, stopped; active or standby
    catalog        pyiceberg's SQL catalog in the metastore's PostgreSQL
    config         partition transform, where rejects go, commit batching
    status         ``ingest table`` and ``ingest query`` (DuckDB)
    metrics        the committer's metrics
    errors         the tables' errors
    audit          ``ingest audit``'s check of the tables: exactly the current segments' files, once

ingest.compact (small published segments rewritten near a target size, replaced exactly once)
    plan           which segments: contiguous runs of small ones per partition, cut near the target
    job            one chunk: registered, rewritten by Spark, checked by its footers, replaced
    runner         the long-running role: one active per source (a lock), standbys, retries
    metrics        the role's metrics (replacements, the store's shape, compaction lag) and health

ingest.cli (the ``ingest`` command: ``ingest.cli:run``; one line per expected failure)
    __init__       main and run: an IngestError becomes one line and its exit code
    parser         every command, its flags and the examples its --help ends with
    common         the settings from the environment, a command's result (--json or text)
    sources        migrate, source apply / list / history, worker
    observe        status, health, segments, gaps list / ack, audit
    actions        suspend, resume, drain, reset, terminate, gc
    compact        ``ingest compact``: one compaction of a source
    tables         table-enable, table, table-commit, query
    __main__       ``python -m ingest.cli``
"""

__version__ = "0.1.0"
