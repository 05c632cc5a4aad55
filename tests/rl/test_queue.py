"""The rollout queue's bookkeeping: what the trainer took survives a restart exactly (invariant 9)."""
import numpy as np

from jaxpod.rl.disaggregated.queue import Consumed, Queue, file_name, from_bytes, to_bytes
from jaxpod.rl.rollout.groups import Group, to_batch
from jaxpod.problems.base import Problem


def _group(i, versions=(3, 4), n=2):
  return Group(Problem(f"{i}+1=", str(i + 1), 2, i), [256, 49, 43], [[50, 257], [51]][:n] + [[52, 53, 257]] * (n - 2),
               [[-0.5, -0.125], [-2.0]][:n] + [[-0.25, -0.5, -0.125]] * (n - 2), [list(versions[:2]), [versions[0]]][:n]
               + [[4, 4, 4]] * (n - 2), [True, False][:n] + [True] * (n - 2), [1.0, 0.0][:n] + [0.5] * (n - 2),
               [True, False][:n] + [False] * (n - 2))


def test_rollout_file_round_trip_keeps_tokens_logprobs_versions():
  groups = [_group(0), _group(1, versions=(5, 6))]
  back, meta = from_bytes(to_bytes(groups, {"worker": 3, "seq": 7}))
  assert meta == {"worker": 3, "seq": 7}
  assert [g.__dict__ for g in back] == [g.__dict__ for g in groups]


def test_batch_rows_are_target_aligned():
  """Row b: prompt then sampled tokens; position t predicts token t+1, so the mask starts at the prompt's last token."""
  b = to_batch([_group(0)], length=8, pad_id=258, scale_rewards="group")
  assert b["tokens"][0].tolist() == [256, 49, 43, 50, 257, 258, 258, 258]
  assert b["loss_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
  np.testing.assert_allclose(b["behaviour"][0, 2:4], [-0.5, -0.125])
  assert b["loss_mask"][1].tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
  assert b["advantages"][0] > 0 > b["advantages"][1]


def test_consumed_state_round_trips_and_compacts_whole_files():
  c = Consumed()
  c.take(file_name(0, 0), [0, 1], 2)
  c.take(file_name(0, 1), [1], 2)
  c.take(file_name(0, 2), [0, 1], 2)
  c.take(file_name(0, 1), [0], 2)
  back = Consumed.from_state(c.state())
  assert back.full == {0: [[0, 2]]} and back.partial == {}
  assert back.is_full(file_name(0, 1)) and not back.is_full(file_name(0, 3))
  assert back.taken_files == {0: 3}


def test_queue_files_listing_and_numbering(tmp_path):
  q = Queue(str(tmp_path / "run"))
  assert q.files() == [] and q.next_seq(1) == 0
  for w, seq in ((1, 0), (0, 0), (1, 1)):
    q.put(w, seq, to_bytes([_group(seq)], {}))
  assert q.files() == ["w0/00000000.st", "w1/00000000.st", "w1/00000001.st"]
  assert q.next_seq(1) == 2 and q.next_seq(0) == 1
  q.beat(1, {"worker": 1, "beat": 4})
  assert q.heartbeats()[1]["beat"] == 4
  q.set_progress({"step": 3, "taken_files": {"1": 2}, "done": False})
  assert q.progress()["taken_files"] == {"1": 2}


def test_trainer_takes_only_groups_within_the_policy_lag(tmp_path):
  """Invariant 9: at version 5 with max_policy_lag 2, a group with a token from version 1 is dropped as stale and
  one with a token from version 6 (weights this trainer never made) as future; both are named, neither trained on."""
  from jaxpod.rl.config import GRPOConfig, RolloutConfig
  from jaxpod.rl.disaggregated.queue_source import QueueSource
  grpo_cfg = GRPOConfig(num_prompts_per_step=1, max_policy_lag=2, filter_groups=False)
  source = QueueSource(str(tmp_path / "run"), None, grpo_cfg, RolloutConfig(), batcher=None)
  source.queue.put(0, 0, to_bytes([_group(0, versions=(1, 4)), _group(1, versions=(5, 6)), _group(2, versions=(3, 5))],
                                  {}))
  pick = source._pick(version=5)
  name = file_name(0, 0)
  assert pick["take"] == [[name, [2]]]
  assert pick["drop"] == [[name, 0, "stale"], [name, 1, "future"]]
