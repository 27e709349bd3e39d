"""What the worker (``ingest``) and the metastore (``metastore``) share: value types, the
root of the exception hierarchy with its exit codes, store URIs, secret redaction, and every
retry and wait schedule (``backoff``: Backoff and the Clock it runs on). It imports neither
of them."""
