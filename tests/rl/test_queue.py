"""The rollout queue's bookkeeping: what the trainer took survives a restart exactly (invariant 9)."""
import numpy as np
import pytest

from jaxpod.problems.environments import NO_VERSION
from jaxpod.rl.disaggregated.queue import Consumed, Queue, _metadata, file_name, from_bytes, to_bytes
from jaxpod.policy.rollout.groups import Group
from jaxpod.rl.batch import to_batch
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


def _episodes(i):
  """A group of two episodes: a tool call (versions 3, 4), the environment's observation, an answer (version 5)."""
  sampled = [[99, 257, 61, 32, 52, 10, 52, 257], [52, 257]]
  from_policy = [[True, True, False, False, False, False, True, True], [True, True]]
  versions = [[3, 4, NO_VERSION, NO_VERSION, NO_VERSION, NO_VERSION, 5, 5], [4, 4]]
  logprobs = [[-0.5 * mine for mine in f] for f in from_policy]
  return Group(Problem(f"{i}*2=", "4", 2, i), [256, 50, 42], sampled, logprobs, versions, [True, True], [1.0, 0.0],
               [True, False], from_policy)


def test_rollout_file_round_trip_keeps_episodes_flags_and_versions_per_token():
  """Invariant 9 for episodes: a file keeps each token's from_policy flag and version (NO_VERSION on observations),
  so the trainer admits by the policy's tokens and masks the observations as a colocated trainer does."""
  from jaxpod.rl.disaggregated.queue import FORMAT
  groups = [_episodes(0), _group(1)]
  blob = to_bytes(groups, {"worker": 0})
  assert _metadata(blob)["format"] == str(FORMAT) == "2"
  back, _ = from_bytes(blob)
  assert [g.__dict__ for g in back] == [g.__dict__ for g in groups]
  assert back[1].from_policy == [[True, True], [True]]  # a single turn: a one-turn episode, every token the policy's
  assert (back[0].oldest_version(), back[0].newest_version()) == (3, 5)
  rows = to_batch(back[:1], length=12, pad_id=258, scale_rewards="group")
  assert rows["loss_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0]  # target-aligned: observations out
  assert rows["versions"][0, 2:10].tolist() == [3, 4, NO_VERSION, NO_VERSION, NO_VERSION, NO_VERSION, 5, 5]


@pytest.mark.parametrize("format", [None, "3"])
def test_a_rollout_file_of_another_format_is_refused_in_one_line(tmp_path, format):
  """An older worker's file (no format field, no from_policy flags) or an unknown format: the trainer refuses it in
  one line naming the file and the fix instead of guessing which tokens the policy sampled."""
  from safetensors.numpy import load, save
  blob = to_bytes([_group(0)], {})
  meta = _metadata(blob)
  arrays = {k: v for k, v in load(blob).items() if format or k != "from_policy"}
  meta = {k: v for k, v in meta.items() if k != "format"} | ({"format": format} if format else {})
  q = Queue(str(tmp_path / "run"))
  q.put(0, 0, save(arrays, metadata=meta))
  with pytest.raises(ValueError) as e:
    q.read(file_name(0, 0))
  what = "no format field (format 1: no per-token from_policy flags)" if format is None else "format 3"
  assert str(e.value).startswith(f"rollout file {tmp_path}/run/queue/rollouts/w0/00000000.st has {what}; this "
                                 "jaxpod reads format 2 only: run the trainer and the rollout workers from the same "
                                 "jaxpod, and start a new run (another trainer.runs_dir)"), e.value
  assert "\n" not in str(e.value)


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
