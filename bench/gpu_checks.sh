#!/usr/bin/env bash
# The GPU checks, in device calls of under 10 minutes each (../shared/gpu/README.md stages the model and wheels).
# Outputs go to $OUT (or ./gpu-out); each check has its own time limit.
#   bash bench/gpu_checks.sh          the CUDA tests (static engine, compiled layers, a killed-and-resumed static run),
#                                     bench/grpo_step.py (raw, ours, ours with eager layers, TRL), a profile of a step
#   bash bench/gpu_checks.sh journeys the zero-shot recipe end to end (target: under 5 minutes on one GPU; its log
#                                     holds the zero-shot evaluations), the demo, and the multi-turn rollout bench
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
if [ "${1:-}" = journeys ]; then
  start=$(date +%s)
  timeout "${RECIPE_SECONDS:-300}" python3 -m rlvr_cli train --algo dapo --config examples/recipes/arithmetic_zero_shot.toml \
    --run.output_dir /tmp/gpu-recipe --run.progress false 2>&1 | grep -v "Loading\|Warning" | tail -30 | tee "$out/recipe.txt"
  echo "recipe wall: $(( $(date +%s) - start )) s" | tee -a "$out/recipe.txt"
  grep -h "eval_accuracy" /tmp/gpu-recipe/metrics.jsonl 2>/dev/null | tail -3 > "$out/recipe_eval.jsonl"
  start=$(date +%s)
  timeout "${DEMO_SECONDS:-100}" python3 examples/demo.py --run.output_dir /tmp/gpu-demo 2>&1 \
    | grep -v "^step\|Loading\|Warning" | tail -15 | tee "$out/demo.txt"
  echo "demo wall: $(( $(date +%s) - start )) s" | tee -a "$out/demo.txt"
  timeout 60 python3 bench/rollout.py --model default --repeats 2 --task rlvr/CalculatorArithmetic-v0 2>&1 \
    | grep -v Warning | tee "$out/rollout_multiturn.txt"
  exit 0
fi
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_static_rollout.py \
  "tests/test_grpo_machinery.py::test_compiled_layers_give_the_eager_logprobs_and_gradients_from_one_graph" \
  "tests/test_resume_state.py::test_a_killed_run_resumes_to_the_uninterrupted_runs_state" 2>&1 | tail -25 | tee "$out/tests.txt"
timeout 220 python3 bench/grpo_step.py --model default --precision bf16 --with-eager-layers 2>&1 | tee "$out/grpo_step.txt"
timeout 120 python3 bench/profile_step.py --model default --precision bf16 --top 15 2>&1 | grep -v "^USDT" | tee "$out/profile.txt"
