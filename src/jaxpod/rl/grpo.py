"""GRPO: which groups the trainer admits, group-relative advantages (host side) and the clipped-ratio loss (jitted).

Admission (`admit`, one rule for both topologies): the trainer at version v (the weights after v
steps) takes a group, or drops it for one reason, checked in this order:
  future   a token from a version above v: weights this trainer never made (a restored trainer after
           a crash that had already published them)
  stale    a token from a version below v - max_policy_lag (invariant 9)
  uniform  with filter_groups: every sample has the same reward, so every advantage is 0 and the group
           teaches nothing (DAPO's dynamic sampling); the trainer draws another group instead (colocated:
           another round of sample_prompts_per_step prompts; disaggregated: the next one in the queue)
A dropped group is consumed (never offered again) and counted as rl/dropped_<reason>. `take` scans
groups in order until it has the groups it needs.

The bound on the wait (`BatchFill`, one rule and one message for both topologies): a batch for which
`grpo.max_sampling_rounds` x `sample_prompts_per_step` groups have been judged on their rewards (taken,
or dropped as uniform) without filling it ends the run in one line. If most of those groups had every sample
correct, the policy has learned the set: the run ends as a success at its last trained step (`Solved`: final eval,
export and summary, exit 0). Otherwise the line names the reason and the knobs (`Starved`, exit 2).
Colocated, that is exactly max_sampling_rounds rounds of sampling; disaggregated, the same number of
groups from the queue. Stale and future drops do not count (a backlog left by a
restart, bounded by the workers' max_queued_files); `rollout.rollout_timeout_s` bounds those.

Advantages, for the n samples of one prompt with rewards r_1..r_n (`scale_rewards`):
  group  (r_i - mean(r)) / (std(r) + eps)      the original GRPO; std over the group (ddof=1, as TRL)
  batch  (r_i - mean(r)) / (std(R) + eps)      std over every reward of the batch (TRL's "batch")
  none   r_i - mean(r)                         Dr. GRPO: no std division (no difficulty bias)

Per completion token t of sample i, with rho = pi_theta(t) / pi_behaviour(t), pi_behaviour the
probability the rollout engine recorded when it sampled t (not recomputed), and pi_theta the trainer's
probability of t under the same distribution the engine draws from: softmax(logits / temperature) after
the rollout's top-k / top-p filter, renormalised over the tokens it keeps (a token it leaves out gets
log-prob `jaxpod.sample.tokens.LOGPROB_FLOOR`, ratio ~0). So an on-policy ratio is exactly 1 with any
filter; recomputing over the unfiltered softmax instead made every filtered step off-policy from the
first one (issue 25). The kept set is a constant of each forward pass (no gradient flows through which
tokens are kept):
  l_t = -min(rho * A_i, clip(rho, 1 - epsilon, 1 + epsilon_high) * A_i)  [+ beta * KL_t]
KL_t = exp(ref - logp) - (ref - logp) - 1 (the k3 estimator against the frozen reference policy).
The loss over the batch (`loss_norm`):
  token     sum of l_t over every completion token / number of those tokens (DAPO; TRL's default)
  sequence  per-sample mean of l_t, then the mean over samples (the original GRPO; length-biased)
  constant  sum of l_t / (samples * max_new_tokens) (Dr. GRPO)

Off-policy corrections (`grpo.tis`, `grpo.mis`; both "none" by default, and then the loss is exactly the one
above). The sampler's mu and the trainer's pi of the same token differ (kernels, precision, the lag): with
pi_old the trainer's log-probs of the batch at this step (stop-gradient: jaxpod takes one optimizer step per
batch, so pi_old == pi in value), per token s_t = pi_old / mu, per sample S = prod_t s_t (`sequence`) or
S^(1/n) (`geometric`, n its completion tokens); log-ratios are clipped to +-MAX_LOG_RATIO before exp:
  weight  w = min(s_t, tis_cap) (tis token) | min(S, tis_cap) (tis sequence) | s_t (tis none)
  mask    M = 1[mis_low <= s_t | S | S^(1/n) <= mis_high] (mis token | sequence | geometric) | 1 (mis none)
  l_t = -M * w * min(r * A_i, clip(r, 1 - epsilon, 1 + epsilon_high) * A_i)  [+ M * beta * KL_t],  r = pi / pi_old
The clipped ratio is then taken against pi_old (decoupled PPO, as verl, TRL and AReaL do), so the whole gap to
mu is in the weight, a constant: a truncated token still trains, at weight tis_cap (PPO's clip against mu would
zero its gradient). That is the published TIS min(pi_old / mu, C), not min(pi / mu, C): equal in value here,
but the latter's gradient vanishes wherever the cap binds. MIS alone weights kept tokens by s_t (IcePop,
prime-rl, TRL's token_mask); tis sequence + mis sequence with tis_cap >= mis_high is TRL's sequence_mask. A
masked token still counts in the normalisation (as TRL): it adds nothing, it does not enlarge the others.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxpod.sample.config import SamplingParams
from jaxpod.sample.tokens import token_logprobs as sample_token_logprobs
from jaxpod.train.task import EndOfData

SCALE_REWARDS = ("group", "batch", "none")
LOSS_NORMS = ("token", "sequence", "constant")
TIS_LEVELS = ("none", "token", "sequence")  # grpo.tis: truncate the weight of each token, or of each sample
MIS_LEVELS = ("none", "token", "sequence", "geometric")  # grpo.mis: mask tokens, or samples (product or geometric mean)
LOGPROB_CHUNK = 128  # positions per chunk of the vocab head in `policy_logprobs` (models/llama/loss.py: CHUNK)
MAX_LOG_RATIO = 20.0  # |log s| is clipped to this before exp (as verl and Tunix): no inf from a long product


TAKE = "take"
DROP_REASONS = ("future", "stale", "uniform")


def admit(group, trainer_version: int, *, max_policy_lag: int, filter_groups: bool) -> str:
  """TAKE, or the reason (one of DROP_REASONS) the trainer at `trainer_version` must not train on `group` (a
  `rollout.groups.Group`: its tokens' versions and its samples' rewards); see the module docstring."""
  if group.newest_version() > trainer_version:
    return "future"
  if group.oldest_version() < trainer_version - max_policy_lag:
    return "stale"
  if filter_groups and not group.mixed:
    return "uniform"
  return TAKE


def take(groups, need: int, trainer_version: int, *, max_policy_lag: int,
         filter_groups: bool) -> tuple[list[int], list[tuple[int, str]]]:
  """Scan `groups` in order until `need` are admitted: (indices taken, [(index, reason)] dropped); the groups
  after the last one taken are not examined."""
  taken: list[int] = []
  dropped: list[tuple[int, str]] = []
  for i, group in enumerate(groups):
    if len(taken) >= need:
      break
    why = admit(group, trainer_version, max_policy_lag=max_policy_lag, filter_groups=filter_groups)
    if why == TAKE:
      taken.append(i)
    else:
      dropped.append((i, why))
  return taken, dropped


class Solved(EndOfData):
  """A batch `BatchFill` gave up on because the policy solves the problems it draws: the run ends at its last trained
  step as at trainer.steps (final eval, export, summary; exit 0), on every host at the same step."""


class Starved(ValueError):
  """A batch `BatchFill` gave up on: one line (exit 2, bad input); every host raises it at the same point."""

  coordinated = True  # decided from the same groups on every host (or on the leader and broadcast): not published


class BatchFill:
  """One batch's admissions (`take` over groups as they come) and the rule that bounds its wait (module docstring)."""

  def __init__(self, need: int, trainer_version: int, *, max_policy_lag: int, filter_groups: bool, limit: int):
    self.need, self.version, self.limit = need, trainer_version, limit
    self.max_policy_lag, self.filter_groups = max_policy_lag, filter_groups
    self.taken = 0
    self.judged = 0  # groups judged on their rewards: taken, or dropped as uniform
    self.uniform_reward = 0.0  # the sum of the uniform groups' (equal) rewards
    self.all_correct = 0  # uniform groups whose every sample is correct (the policy solves that problem)
    self.by_source: dict = {}  # source (e.g. a worker) -> {"taken": n, <reason>: n}

  @property
  def full(self) -> bool:
    return self.taken >= self.need

  def take(self, groups, source=None) -> tuple[list[int], list[tuple[int, str]]]:
    """`take` of the groups still needed from `groups` (from `source`), tallied; groups past the limit are left
    unexamined (so a batch gives up after exactly `limit` groups judged)."""
    groups = groups[:max(self.limit - self.judged, 0)]
    taken, dropped = take(groups, self.need - self.taken, self.version, max_policy_lag=self.max_policy_lag,
                          filter_groups=self.filter_groups)
    tally = self.by_source.setdefault(source, {"taken": 0})
    tally["taken"] += len(taken)
    for i, why in dropped:
      tally[why] = tally.get(why, 0) + 1
      if why == "uniform":
        self.uniform_reward += groups[i].rewards[0]
        self.all_correct += all(groups[i].correct)
    self.taken += len(taken)
    self.judged += len(taken) + sum(why == "uniform" for _, why in dropped)
    return taken, dropped

  def dropped(self, why: str) -> int:
    return sum(t.get(why, 0) for t in self.by_source.values())

  def starved(self) -> bool:
    """The batch is not full and `limit` groups were judged for it: give up (`error`)."""
    return not self.full and self.judged >= self.limit

  def solved(self) -> bool:
    """Starved because the policy solves its problems: most groups judged had every sample correct."""
    return self.starved() and 2 * self.all_correct > self.judged

  def give_up(self) -> Solved | Starved:
    """What ends the run once `starved`: `Solved` (success) or `Starved` (the one-line error)."""
    return self.end() if self.solved() else self.error()

  def end(self) -> Solved:
    """The one line a solved run ends with (both topologies)."""
    return Solved(f"rl: the policy solves its training problems: {self.all_correct} of the {self.judged} groups "
                  f"judged for step {self.version + 1} had every sample correct and {self.taken} of the {self.need} "
                  f"needed have rewards that differ (grpo.filter_groups; limit grpo.max_sampling_rounds x "
                  f"sample_prompts_per_step = {self.limit} groups), so the run ends at step {self.version}; for more "
                  "to learn, a harder --problems")

  def describe(self) -> str:
    """`3 of 32 groups taken; worker 0: 2 taken, dropped 61 uniform, 4 stale; ...` (the progress line)."""
    parts = []
    for source, tally in sorted(self.by_source.items(), key=lambda kv: str(kv[0])):
      drops = ", ".join(f"{tally[why]} {why}" for why in DROP_REASONS if tally.get(why))
      parts.append(f"{'' if source is None else f'{source}: '}{tally['taken']} taken, dropped {drops or 'none'}")
    return (f"{self.taken} of {self.need} groups taken, {self.judged} of at most {self.limit} judged on their "
            f"rewards" + "".join(f"; {p}" for p in parts))

  def error(self) -> Starved:
    """The one line that ends the run (both topologies)."""
    uniform = self.dropped("uniform")
    mean = self.uniform_reward / max(uniform, 1)
    habit = "fails" if mean < 0.5 else "solves"
    return Starved(f"rl: grpo.filter_groups dropped {uniform} of the {self.judged} groups judged for step "
                   f"{self.version + 1} because every sample got the same reward (mean {mean:.2f}: the policy "
                   f"{habit} almost every problem) and {self.taken} of the {self.need} needed have rewards that "
                   f"differ (limit grpo.max_sampling_rounds x sample_prompts_per_step = {self.limit} groups); train "
                   "the starting policy longer (warmup.steps, or a stronger model.hf), give partial credit "
                   "(rewards), change the problem set (--problems), set grpo.filter_groups false, or raise "
                   "grpo.max_sampling_rounds")


def advantages(rewards_GxN: np.ndarray, scale: str, eps: float = 1e-4) -> np.ndarray:
  """Group-relative advantage of every sample, [G, N] float32 (see the module docstring)."""
  r = np.asarray(rewards_GxN, np.float64)
  if scale not in SCALE_REWARDS:
    raise ValueError(f"rl.grpo.scale_rewards={scale!r}; use one of {SCALE_REWARDS}")
  if r.ndim != 2 or r.shape[1] < 2:
    raise ValueError(f"GRPO needs n >= 2 samples per prompt, got rewards of shape {r.shape}")
  centered = r - r.mean(axis=1, keepdims=True)
  if scale == "group":
    centered = centered / (r.std(axis=1, ddof=1, keepdims=True) + eps)
  elif scale == "batch":
    centered = centered / (r.std(ddof=1) + eps)
  return centered.astype(np.float32)


def token_logprobs(logits_BxTxV, targets_BxT, sampling: SamplingParams):
  """log pi_theta(target), float32 [B, T], under the distribution the engine sampled from: softmax(logits / T)
  after the same top-k / top-p filter, renormalised (`jaxpod.sample.token_logprobs`; see the module docstring)."""
  return sample_token_logprobs(logits_BxTxV, targets_BxT, sampling)


def policy_logprobs(graphdef, weights, inputs_BxT, targets_BxT, sampling: SamplingParams,
                    chunk: int = LOGPROB_CHUNK):
  """`token_logprobs` of the policy's logits on inputs_BxT, float32 [B, T], without its [B, T, V] logits
  (`models/llama/loss.token_logps`): by vocabulary slices when the sampler filters nothing, else `chunk` positions at
  a time, each chunk rematerialised in the backward pass."""
  from jaxpod.models.llama.loss import token_logps
  if sampling.top_k == 0 and sampling.top_p >= 1:  # no filter: log softmax(logits / T), by vocabulary slices
    return token_logps(graphdef, weights, inputs_BxT, targets_BxT, temperature=sampling.temperature or 1.0)
  return token_logps(graphdef, weights, inputs_BxT, targets_BxT,
                     lambda logits, targets: token_logprobs(logits, targets, sampling), chunk)


def is_correction(log_ratio_BxT, mask_BxT, *, tis: str, tis_cap: float, mis: str, mis_low: float, mis_high: float):
  """(weight w, keep M, truncated) [B, T] of the off-policy correction, from log(pi_old / mu) on completion tokens
  (mask_BxT); no gradient flows through them (see the module docstring)."""
  m = mask_BxT.astype(jnp.float32)
  lr = jax.lax.stop_gradient(jnp.where(mask_BxT, log_ratio_BxT, 0.0))
  seq = jnp.sum(lr, axis=1, keepdims=True)
  level = {"token": lr, "sequence": seq, "geometric": seq / jnp.maximum(jnp.sum(m, axis=1, keepdims=True), 1.0)}
  ratio = {k: jnp.broadcast_to(jnp.exp(jnp.clip(v, -MAX_LOG_RATIO, MAX_LOG_RATIO)), lr.shape)
           for k, v in level.items()}
  weight, truncated, keep = ratio["token"], jnp.zeros(lr.shape, bool), jnp.ones(lr.shape, jnp.float32)
  if tis != "none":
    truncated = ratio[tis] > tis_cap
    weight = jnp.minimum(ratio[tis], tis_cap)
  if mis != "none":
    keep = ((ratio[mis] >= mis_low) & (ratio[mis] <= mis_high)).astype(jnp.float32)
  return weight, keep, truncated


def policy_loss(logp_BxT, behaviour_BxT, adv_B, mask_BxT, ref_BxT=None, *, epsilon: float, epsilon_high: float,
                beta: float, loss_norm: str, max_new_tokens: int, tis: str = "none", tis_cap: float = 2.0,
                mis: str = "none", mis_low: float = 0.5, mis_high: float = 2.0):
  """(loss, metric sums) of the clipped-ratio objective; mask_BxT marks completion tokens; tis / mis: the off-policy
  corrections, off by default (see module docstring)."""
  m = mask_BxT.astype(jnp.float32)
  log_ratio = jnp.where(mask_BxT, logp_BxT - behaviour_BxT, 0.0)
  ratio = jnp.exp(log_ratio)
  corrected = tis != "none" or mis != "none"
  if corrected:  # decoupled: the clip against pi_old (= pi in value), the gap to mu in a constant weight
    weight, keep, truncated = is_correction(log_ratio, mask_BxT, tis=tis, tis_cap=tis_cap, mis=mis,
                                            mis_low=mis_low, mis_high=mis_high)
    rho = jnp.exp(logp_BxT - jax.lax.stop_gradient(logp_BxT))
  else:
    rho = ratio
  a = adv_B[:, None].astype(jnp.float32)
  unclipped = rho * a
  clipped = jnp.clip(rho, 1.0 - epsilon, 1.0 + epsilon_high) * a
  per_token = -jnp.minimum(unclipped, clipped)
  if corrected:
    per_token = per_token * weight
  kl = jnp.zeros_like(per_token)
  if ref_BxT is not None and beta > 0:
    d = jnp.where(mask_BxT, ref_BxT - logp_BxT, 0.0)
    kl = jnp.exp(d) - d - 1.0
    per_token = per_token + beta * kl
  if corrected:
    per_token = per_token * keep
  tokens = jnp.sum(m)
  b = mask_BxT.shape[0]
  if loss_norm == "token":
    loss = jnp.sum(per_token * m) / jnp.maximum(tokens, 1.0)
  elif loss_norm == "sequence":
    loss = jnp.mean(jnp.sum(per_token * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0))
  elif loss_norm == "constant":
    loss = jnp.sum(per_token * m) / (b * max_new_tokens)
  else:
    raise ValueError(f"rl.grpo.loss_norm={loss_norm!r}; use one of {LOSS_NORMS}")
  was_clipped = (unclipped != clipped) & (clipped < unclipped)  # the min picked the clipped term
  has_tokens = tokens > 0
  sums = {"tokens": tokens, "pg_loss_sum": jnp.sum(per_token * m),
          "clipped_sum": jnp.sum(was_clipped * m), "kl_sum": jnp.sum(kl * m),
          "ratio_sum": jnp.sum(ratio * m), "logprob_gap_sum": jnp.sum(jnp.abs(log_ratio) * m),
          # exact over the step's global batch (the loss is one jitted computation over every host's rows)
          "ratio_min": jnp.where(has_tokens, jnp.min(jnp.where(mask_BxT, ratio, jnp.inf)), 1.0),
          "ratio_max": jnp.where(has_tokens, jnp.max(jnp.where(mask_BxT, ratio, -jnp.inf)), 1.0)}
  if corrected:
    sums["is_weight_sum"] = jnp.sum(weight * keep * m)
  if tis != "none":
    sums["tis_truncated_sum"] = jnp.sum(truncated * m)
  if mis != "none":
    sums["mis_masked_sum"] = jnp.sum((1.0 - keep) * m)
    sums["mis_masked_seqs"] = jnp.sum((jnp.sum(keep * m, axis=1) == 0) & (jnp.sum(m, axis=1) > 0))
  return loss, sums


def correction_metrics(raw: dict, global_batch: int) -> dict:
  """The logged off-policy metrics from `policy_loss`'s sums (the ones present): ratio_min / ratio_max of pi / mu
  over the step's completion tokens; is_weight (mean w * M); tis_fraction, mis_fraction (of completion tokens) and
  mis_seq_fraction (of samples) truncated or masked."""
  tokens = max(raw["tokens"], 1.0)
  out = {k: raw[k] for k in ("ratio_min", "ratio_max") if k in raw}
  for name, key, per in (("is_weight", "is_weight_sum", tokens), ("tis_fraction", "tis_truncated_sum", tokens),
                         ("mis_fraction", "mis_masked_sum", tokens), ("mis_seq_fraction", "mis_masked_seqs",
                                                                      max(global_batch, 1))):
    if key in raw:
      out[name] = raw[key] / per
  return out
