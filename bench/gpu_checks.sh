#!/usr/bin/env bash
# The GPU checks of the rollout engines, in one device call (../shared/gpu/README.md stages the model and wheels):
# the CUDA tests, bench/rollout.py, bench/grpo_step.py (raw, ours, ours with the hf engine, TRL) and a profile of
# one step, then the demo. Each has its own time limit; outputs go to $OUT (or ./gpu-out).
# "recipe" runs the other long check instead: the zero-shot recipe end to end (target: under 5 minutes on one GPU),
# then its held-out zero-shot evaluation. Usage: bash bench/gpu_checks.sh [recipe]
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
if [ "${1:-}" = recipe ]; then
  start=$(date +%s)
  timeout "${RECIPE_SECONDS:-420}" python3 -m rlvr_cli train --algo dapo --config examples/recipes/arithmetic_zero_shot.toml \
    --run.output_dir /tmp/gpu-recipe --run.progress false 2>&1 | grep -v "Loading\|Warning" | tail -30 | tee "$out/recipe.txt"
  echo "recipe wall: $(( $(date +%s) - start )) s" | tee -a "$out/recipe.txt"
  timeout 120 python3 -m rlvr_cli eval --config /tmp/gpu-recipe/config.yaml --model /tmp/gpu-recipe --zero-shot 2>&1 \
    | tail -10 | tee "$out/recipe_eval.txt"
  exit 0
fi
# the static engine's tests, its multi-turn episodes and a killed-and-resumed run on it (bitwise), on CUDA
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_static_rollout.py tests/test_multiturn_rollout.py \
  "tests/test_resume_state.py::test_a_killed_run_resumes_to_the_uninterrupted_runs_state" 2>&1 | tail -25 | tee "$out/tests.txt"
timeout 120 python3 bench/rollout.py --model default --repeats 3 2>&1 | grep -v Warning | tee "$out/rollout.txt"
timeout 90 python3 bench/rollout.py --model default --repeats 2 --task rlvr/CalculatorArithmetic-v0 2>&1 | grep -v Warning \
  | tee "$out/rollout_multiturn.txt"
timeout 240 python3 bench/grpo_step.py --model default --precision bf16 --with-hf-rollout 2>&1 | tee "$out/grpo_step.txt"
timeout 100 python3 bench/profile_step.py --model default --precision bf16 --top 15 2>&1 | grep -v "^USDT" | tee "$out/profile.txt"
# the demo (examples/demo.toml) on the GPU, within what is left of the call
timeout "${DEMO_SECONDS:-120}" python3 examples/demo.py --run.output_dir /tmp/gpu-demo 2>&1 | grep -v "^step\|Loading\|Warning" | tail -15 | tee "$out/demo.txt"
