"""Episodes on 2 launched hosts whose tools finish in different orders (`policy.rollout.episodes`)."""
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "workers" / "skewed_tools.py"


@pytest.mark.slow
@pytest.mark.multihost
def test_two_hosts_admit_each_observation_in_the_same_round_when_their_tools_finish_in_different_orders(launch_hosts):
  """Invariant 1 for episodes: every host steps its own environments and host 0's slow steps are host 1's fast
  ones, yet the leader's broadcast of which observations join each round gives both hosts the same schedule (each
  batch's digest compared: a mismatch raises) and the same episodes, which are those of the turn-by-turn loop."""
  result = launch_hosts(WORKER, hosts=2, devices_per_host=1, timeout_s=300)
  assert result.returncode == 0, result.transcript[-3000:]
  got = [[l.split()[1:] for l in out if l.startswith("EPISODES")] for out in result.output]
  assert got[0] == got[1] and len(got[0]) == 1, got
  [[_, same, broadcasts, steps]] = got[0]
  assert same == "True" and 0 < int(broadcasts) <= int(steps) + 1
