"""What benchmarks share with each other and lend to the integration tests.

Benchmarks run from a checkout as modules (`python -m bench.bench_x`) and never import `tests`: the
suite may borrow a rig from here, not the other way round, so a bench does not break when a test
helper changes.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout, whose examples and repositories benches read
