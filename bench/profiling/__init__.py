"""Where one worker's CPU goes.

``worker`` (``python -m bench.worker_profile``, or ``python -m bench --profile``) runs one worker
under ``agent`` (a sampling thread in the worker's own process) and reads its threads from /proc;
``report`` turns two snapshots into the table. ``jfr_top`` reads a Java Flight Recorder recording
of any Spark JVM (``python -m bench.profiling.jfr_top``).
"""
