"""Exactly-once Kafka ingestion workers.

The subpackages follow a split's journey, consume -> build -> publish, and never back: a
worker's group member owns a source's partitions and cuts splits from their offsets
(``consume``); Spark reads each split's records from Kafka and writes Parquet files nobody sees
yet (``builder``); each split is published with its offsets in one serial-guarded metastore
transaction (``publish``). What they hand on is below them all (``splits``), beside Spark
(``spark``) and the segment files' layout (``segments``); operators look and act through
``ops`` and ``cli``; ``table`` appends published segments to Iceberg tables, ``compact``
replaces small ones.

Layers, lowest first; a module imports only from its own layer and the ones below it, and
the layers of one row not from each other (tests/unit/test_layers.py checks this)::

    ingest_common < metastore < ingest (shared) < formats < spec < splits < spark | segments
        < builder < publish | ops | table | compact < consume < ingest.worker < cli

``ingest.roles`` belongs to the shared top level: ``table`` and ``compact`` each run a role on it.
``formats`` (the record formats, the registry) and ``spec`` (source specs) sit below every
stage, and import none of them.

Module map:

ingest (top level: the shared base, and the worker process that wires the layers)
    errors         the worker's exceptions under ingest_common's root (exit codes there)
    topics         a source's topics: listed or matching its topic_pattern, in the cluster's metadata
    config         settings from the environment; librdkafka client configuration
    env_files      settings read from files (``NAME_FILE``, as Docker and Kubernetes mount secrets)
    kafka_java     Spark's Kafka reader's (Java client) properties, derived from the worker's librdkafka ones
    kafka_auth     a broker refusing the worker's credentials: one line at start, raised, never retried
    logs           structlog set-up (JSON events, redacted), librdkafka's log bridge, stack dumps on SIGUSR1
    abandoned      threads given up on (a Spark start, a role's pass): the process exits without them
    worker         one worker process: settings, metastore, Spark, pipeline, consumer, loop
    __main__       ``python -m ingest``: the command line

ingest.roles (part of the shared top level: a role that runs on one process at a time per source)
    runner         run_singleton_role: the lock, standby or active, retries, passes watched (deadline, stop)
    health         its state (starting, standby, active, overrun, stopped), /healthz and /readyz

ingest.formats (record formats behind a schema registry; no Spark: protobuf runs in its Python workers)
    wire           the formats a spec names, the Confluent wire format's header, the decoded key's columns
    types          column types (Spark's DDL: scalars, decimal, array, map, struct): parsed, widened, as Spark types
    registry       the [registry] section, the registry client, a subject's latest Avro schema
    avro           Avro reader schemas: a spec's columns, one writer's decode pair, a registry record's columns
    avro_resolution  Avro's schema resolution rules: can a writer schema be read with a reader schema
    json_schema    a registry's JSON Schema as the spec's columns (schema_from = "registry")
    protobuf_schemas a Protobuf writer schema's FileDescriptorProtos and imports, from the registry
    protobuf       the Confluent Protobuf framing, decoded in Spark's Python workers (mapInArrow)
    protobuf_fields  a writer message's fields into the spec's columns (nested too); values no column holds

ingest.spec (source specs, as applied and as a worker holds them)
    model          the spec's dataclasses, round-tripped through JSON (how the metastore stores them)
    parse          the TOML parsed and validated; a registry's latest schema as the reader schema, at apply
    table          the [table] section: the Iceberg catalog of the source's tables, its secrets from the environment
    evolution      what ``source apply`` refuses when an Avro source's reader schema changes
    holder         the spec a worker builds with now and its version (SpecHolder), replaced together

ingest.consume (one polling thread: the consumer group's member; it reads no record)
    kafka          the one boundary to the group member (confluent-kafka): typed consumer, error codes, quirks
    log_offsets    each partition's last stable and earliest offsets, asked of the brokers (ListOffsets)
    validator      KIP-320 for a member that reads nothing: a position confirmed under its leader epoch
    loop           serve the callbacks, learn the log ends, cut due splits, hand them on, hold back for backpressure
    log_ends       the log-end answers and validations applied: cuts go on, or the partition stops (gaps)
    cutter         splits cut from offsets: records, estimated bytes, age; bytes per offset learned
    context        what the loop's parts share (LoopContext), the metastore calls and stages they need
    rebalance      assign / revoke / lost callbacks: claim (new serials), kill switches
    assignment     the partitions owned now, each one's lifecycle as a state machine
    positioning    the one repositioning path (rewind, reset, skipped gap)
    outcomes       what a finished split does: offsets, bytes per offset, fence or rewind, health
    gaps           offsets gone from the log (retention, truncation): measured, recorded, skipped or stopped
    controls       suspend, drain, resume, resets and spec versions, as a worker applies them
    heartbeats     the worker's registry entry: heartbeats, controls read, error reports
    background     the thread every metastore call outside a rebalance callback runs on
    group_offsets  published offsets committed to the group as advice for Kafka's tools
    loop_metrics   lag and the loop's gauges
    publish_watch  a publish unfinished past its bound makes the worker unhealthy
    build_watch    a build running past its deadline's interrupt makes the worker unhealthy
    registry_watch partitions waiting for the schema registry: held, reported (readyz, status, metrics)
    topic_watch    a pattern source's topics: new ones registered (start_from), deleted ones retired

ingest.splits (what a split's journey hands on: below every stage)
    split          a sealed split: a range of one partition's offsets, its leader epoch, its estimate
    kill_switch    a split's kill switch: tripped once; a publish holds it across its commit

ingest.spark (a role's Spark session and what it runs on)
    session        a role's session settings, its owner (SessionSource), job tags and their interrupts
    start          starting a role's session (local, standalone or Spark Connect) within a bound
    connect        the Spark Connect session: bounded client retries, re-created when the server lost it
    jars           where the pinned Spark jars are (S3, Kafka source, Avro, Iceberg, JDBC)

ingest.segments (segment files: where they live, which split each belongs to)
    store          the store's layout and file operations (file://, s3a://, ...)
    output_files   which split each output file belongs to, from its footers

ingest.builder (the build stage: splits into Parquet files, invisible until published)
    queue          the build queue: a future per split; batches, linger, retries, registry waits
    job            the Spark job over a batch of splits: read, parse, write, account
    kafka_read     Spark's Kafka batch read of each split's exact offsets (layers, read_committed)
    accounting     a job's aggregates per split (offsets, bad records, bytes, ...), held against its range
    plan           the expressions that parse the records read, classify errors, name unknown ids
    value_checks   values no segment may carry (strings not UTF-8, times outside years 1-9999): rejects
    changes        upsert sources' rows: _op, tombstones keyed from the Kafka key, Debezium envelopes
    debezium_types Debezium's semantic types (io.debezium.time.*, Connect decimals) read as their columns mean
    registration   every build registered in the metastore before it writes
    start          the build stage started as a worker starts it: Spark's reader, the session, writer schemas
    warm_up        the first build before joining the group: the source's newest records, thrown away
    writer_schemas writer schemas from the registry: kept once served, a 404 waited for, never a failure kept
    registry_wait  splits waiting for the schema registry: their partitions, since when, its last error

ingest.publish (built splits made visible, in offset order per partition)
    queue          every split in flight with its build's future; one thread publishes in order, outcomes
    settle         one built split published or not, the outcome types, who may delete its files
    publisher      the serial-guarded publish transaction, retried, never twice

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
    upsert         an upsert table's committer: per partition offsets, a batch staged on a branch, swapped in
    merge          an upsert batch in Spark: the last change per key, MERGE INTO a branch; the maintenance
    spark_catalog  Iceberg's Spark catalog over the metastore's catalog tables (JdbcCatalog), its extensions
    replacement    a compaction's replacement as one Iceberg overwrite snapshot: held files out, new in
    refusals       segments the table cannot take: found by halving a batch, kept pending, retried, reported
    properties     the table properties the committer keeps (commit seq, segments) and the head check
    runner         the committer run as a singleton role (ingest.roles): its lock, passes
    role           the committer's role: pacing, the errors a pass retries, its names and health
    schema         the table's schema from the segments' files: created, evolved, widened
    enable         ``ingest table-enable``: a source's tables on (its own catalog opened first)
    catalog        the tables' catalog: pyiceberg's SQL catalog in the metastore, or the spec's (REST, Glue...)
    config         partition transform, where rejects go, commit batching
    status         ``ingest table`` and ``ingest query`` (DuckDB)
    metrics        the committer's metrics
    errors         the tables' errors
    faults         fault injection for tests: a committer paused at a named point, to be killed there
    audit          ``ingest audit``'s check of the tables: exactly the current segments' files, once
    upsert_audit   ``ingest audit``'s check of an upsert table: its offsets, one row per key, cross-partition keys

ingest.compact (small published segments rewritten near a target size, replaced exactly once)
    plan           which segments: contiguous runs of small ones per partition, cut near the target
    job            one chunk: registered, rewritten by Spark, checked by its footers, replaced
    runner         the compactor as a singleton role (ingest.roles): its lock, passes, Spark job interrupted
    metrics        the role's metrics (replacements, the store's shape, compaction lag)

ingest.cli (the ``ingest`` command: ``ingest.cli:run``; one line per expected failure)
    __init__       main and run: an IngestError becomes one line and its exit code
    parser         every command, its flags and the examples its --help ends with
    common         the settings from the environment, a command's result (--json or text)
    sources        migrate, source apply / list / history, check, worker
    observe        status, health, segments, gaps list / ack, audit
    actions        suspend, resume, drain, reset, terminate, gc
    compact        ``ingest compact``: one compaction of a source
    check          ``ingest check``'s preflight checks: every dependency a worker needs, one line each
    check_spark    ``ingest check --spark``: the build stage started, the newest records built and deleted
    tables         table-enable, table, table-commit, query
    __main__       ``python -m ingest.cli``
"""

__version__ = "0.1.0"
