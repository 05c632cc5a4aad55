#!/usr/bin/env bash
# RL on a prompt file: GSM8K-format word problems, a supervised warm-up exported as a HF checkpoint,
# then `jaxpod rl --model.hf DIR --problems.type dataset --problems.path problems.jsonl` (see README.md here).
#   bash examples/rl_word_problems/run.sh OUT_DIR [SEED]      (from any folder; OUT_DIR relative to it)
# `jaxpod` is the one on PATH, else the repo's .venv/bin/jaxpod; JAXPOD=... and PY=... override.
# STEPS (60) and WARMUP_STEPS (400) shorten a trial run.
set -euo pipefail
OUT=${1:?usage: run.sh OUT_DIR [SEED]}
SEED=${2:-0}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ -z "${JAXPOD:-}" ]; then
  JAXPOD=$(command -v jaxpod || true)
  [ -n "$JAXPOD" ] || JAXPOD=$REPO/.venv/bin/jaxpod
fi
if [ ! -x "$JAXPOD" ]; then
  echo "run.sh: no jaxpod on PATH and no $JAXPOD; install it (make venv in $REPO) or set JAXPOD=/path/to/jaxpod" >&2
  exit 2
fi
# the Python that runs jaxpod: the one beside it (a venv), else the one its script names
if [ -z "${PY:-}" ]; then
  PY=$(dirname "$JAXPOD")/python
  [ -x "$PY" ] || PY=$(head -n 1 "$JAXPOD" | sed 's/^#!//')
fi
# Both runs read the file the same way: the question column, GSM8K's verifier and reward, 128 held-out problems.
PROBLEMS=(--problems.type dataset --problems.prompt_column question --problems.verifier gsm8k --rewards '[gsm8k]'
      --problems.eval_size 128 --rollout.max_prompt_len 56 --rollout.max_new_tokens 20 --trainer.seed "$SEED")

# 1. the data: problems.jsonl (RL prompts, correct answers) and sft.jsonl (other questions, a teacher that misreads take-away problems as sums)
"$JAXPOD" data word-problems --out "$OUT/data" --seed "$SEED"

# 2. the supervised warm-up on sft.jsonl (jaxpod rl's warm-up; one GRPO step after it, then its export is taken)
"$JAXPOD" rl "${PROBLEMS[@]}" --problems.path "$OUT/data/sft.jsonl" --model.max_position_embeddings 96 \
  --warmup.steps "${WARMUP_STEPS:-400}" --warmup.batch_size 64 --warmup.lr 3e-3 --trainer.steps 1 --trainer.eval_every 1 \
  --grpo.num_prompts_per_step 8 --grpo.sample_prompts_per_step 0 --grpo.filter_groups false \
  --trainer.runs_dir "$OUT/warm" --trainer.run_name warm
# ... as a HF checkpoint with tokenizer files equal to the byte-level tokenizer (transformers and TRL load it)
rm -rf "$OUT/policy" && cp -r "$OUT/warm/warm/warmup/hf" "$OUT/policy"
"$PY" -c "import sys; from jaxpod.models.llama.tokenizer import save_byte_tokenizer; save_byte_tokenizer(sys.argv[1])" "$OUT/policy"

# 3. RL from that checkpoint on problems.jsonl: held-out greedy accuracy and pass@1 / pass@4 before and after
"$JAXPOD" rl --model.hf "$OUT/policy" "${PROBLEMS[@]}" --problems.path "$OUT/data/problems.jsonl" --eval.k 4 \
  --trainer.steps "${STEPS:-60}" --trainer.eval_every 20 --grpo.num_prompts_per_step 16 \
  --grpo.sample_prompts_per_step 32 --rollout.temperature 1.0 \
  --trainer.runs_dir "$OUT/rl" --trainer.run_name rl
