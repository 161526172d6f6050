#!/usr/bin/env bash
# The GPU checks, in device calls of under 10 minutes each (../shared/gpu/README.md stages the model and wheels).
# Outputs go to $OUT (or ./gpu-out); each check has its own time limit.
#   bash bench/gpu_checks.sh          the CUDA tests (static engine, compiled layers, a killed-and-resumed static run),
#                                     bench/grpo_step.py (raw, ours, ours with eager layers, TRL), a profile of a step
#   bash bench/gpu_checks.sh recipe   the zero-shot recipe end to end (issue 49's target: under 10 minutes on one GPU),
#                                     alone in its call: its evaluations (own and transfer wording, warm start and after),
#                                     its wall time, its step-time split (time/rollout_s, time/update_s) and best.json
#   bash bench/gpu_checks.sh journeys the demo, the multi-turn rollout bench, and issue 50's overlap: colocated k = 1
#                                     against k = 0 on the default model, step time and GPU busy share (target >= 80%)
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
if [ "${1:-}" = recipe ]; then
  # 570 s: the device's 600-s call less the staging above; a run cut short still leaves its metrics so far
  start=$(date +%s)
  timeout "${RECIPE_SECONDS:-570}" python3 -m rlvr_cli train --algo dapo --config examples/recipes/arithmetic_zero_shot.toml \
    --run.output_dir /tmp/gpu-recipe --run.progress false 2>&1 | grep -v "Loading\|Warning" | tail -30 | tee "$out/recipe.txt"
  echo "recipe wall: $(( $(date +%s) - start )) s" | tee -a "$out/recipe.txt"
  cp /tmp/gpu-recipe/metrics.jsonl /tmp/gpu-recipe/machine.json /tmp/gpu-recipe/best_model/best.json "$out/" 2>/dev/null
  exit 0
fi
if [ "${1:-}" = journeys ]; then
  start=$(date +%s)
  timeout "${DEMO_SECONDS:-100}" python3 examples/demo.py --run.output_dir /tmp/gpu-demo 2>&1 \
    | grep -v "^step\|Loading\|Warning" | tail -15 | tee "$out/demo.txt"
  echo "demo wall: $(( $(date +%s) - start )) s" | tee -a "$out/demo.txt"
  timeout 60 python3 bench/rollout.py --model default --repeats 2 --task rlvr/CalculatorArithmetic-v0 2>&1 \
    | grep -v Warning | tee "$out/rollout_multiturn.txt"
  timeout 200 python3 bench/overlap.py --model default --staleness 1 --steps 6 --prompts 8 --group-size 8 2>&1 \
    | grep -v Warning | tee "$out/overlap.txt"
  exit 0
fi
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_static_rollout.py \
  "tests/test_grpo_machinery.py::test_compiled_layers_give_the_eager_logprobs_and_gradients_from_one_graph" \
  "tests/test_resume_state.py::test_a_killed_run_resumes_to_the_uninterrupted_runs_state" 2>&1 | tail -25 | tee "$out/tests.txt"
timeout 220 python3 bench/grpo_step.py --model default --precision bf16 --with-eager-layers 2>&1 | tee "$out/grpo_step.txt"
timeout 120 python3 bench/profile_step.py --model default --precision bf16 --top 15 2>&1 | grep -v "^USDT" | tee "$out/profile.txt"
