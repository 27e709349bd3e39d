"""``python -m bench.freshness``: the equal-freshness phase alone (bench/freshness/phase.py)."""

from __future__ import annotations

import sys

from bench.freshness.phase import main

if __name__ == "__main__":
    sys.exit(main())
