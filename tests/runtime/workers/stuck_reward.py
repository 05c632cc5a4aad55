"""A reward plugin that blocks forever on host 1 from its 41st call on (issue 51's reproduction), given to
`jaxpod rl` as `--rewards '[tests.runtime.workers.stuck_reward:reward]'`. Prints `STUCK <unix time>` when it blocks."""
import os
import threading
import time

CALLS = 0


def reward(problem, completion, finished):
  """Exact match, until host 1 stops answering."""
  global CALLS
  CALLS += 1
  if os.environ.get("JAXPOD_PROCESS_ID") == "1" and CALLS > 40:
    print("STUCK", time.time(), flush=True)
    threading.Event().wait()
  return float(completion.strip() == problem.answer)
