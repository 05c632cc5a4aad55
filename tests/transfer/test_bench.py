"""`jaxpod bench transfer` arithmetic: fan-out figures from per-process metrics (no processes run)."""
from __future__ import annotations

import pytest

from jaxpod.bench.transfer import command as bench
from jaxpod.bench.transfer import roles


def test_fanout_summary_aggregates_over_the_receive_span():
  """Two trainer hosts each publish half; two clients overlap in time: aggregate = both clients'
  bytes over first fetch start -> last end; per client = bytes / its own receive seconds."""
  half = 500_000_000
  pubs = [{"bytes": half, "seconds": 0.5, "phases": {"flatten": 0.1}},
          {"bytes": half, "seconds": 0.25, "phases": {"flatten": 0.1}}]
  got = [{"seconds": 1.0, "end": 11.0, "phases": {"fetch": 1.0}}, {"seconds": 2.0, "end": 12.0, "phases": {"fetch": 2.0}}]
  r = bench._summary("arrow_flight", 2, 2, [(pubs, got)])
  assert r["bytes"] == 2 * half and r["publish_s"] == 0.5  # the slowest trainer host
  assert r["receive_span_s"] == pytest.approx(2.0)  # from 10.0 (both started) to 12.0
  assert r["aggregate_gb_per_s"] == pytest.approx(2 * 1.0 / 2.0)
  assert r["per_client_gb_per_s"] == pytest.approx((1.0 + 0.5) / 2) and r["per_client_min_gb_per_s"] == pytest.approx(0.5)
  assert r["gb_per_s"] == pytest.approx(1.0 / 2.5)  # the model over publish + span


def test_bench_shapes_split_over_hosts_and_bad_counts_are_refused():
  assert all(rows % 2 == 0 for rows, _ in roles.shapes(1 << 20))
  with pytest.raises(ValueError, match="--clients"):
    bench.run(1 << 20, ["checkpoint"], clients=0)
