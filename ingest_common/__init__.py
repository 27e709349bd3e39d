"""What the worker (``ingest``) and the metastore (``metastore``) share: value types, the
root of the exception hierarchy with its exit codes, store URIs and secret redaction.
It imports neither of them."""
