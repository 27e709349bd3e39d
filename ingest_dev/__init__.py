"""Development and test support, not shipped in the wheel: local servers (PostgreSQL, Apache
Kafka, an S3 API), the demo and the exactly-once verifier. Importable from a checkout (the
repository root on ``sys.path``: scripts/python puts it there); production code never imports it."""
