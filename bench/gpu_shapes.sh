#!/usr/bin/env bash
# Issue 48's GPU table in one device call (after ../shared/gpu's stage call): each published shape against TRL, full
# and LoRA r 16, then the 7B shape with LoRA and gradient checkpointing. Each row has its own time limit, writes its
# output under $OUT as it goes (a contender's JSON line as soon as it finishes), and logs Dynamo's recompiles.
#   run(command="source /root/keep/env.sh && bash bench/gpu_shapes.sh", carry=[".gpu/partb"], timeout_s=590)
set -u
out=${OUT:-/tmp/gpu_shapes}; mkdir -p "$out"
export TORCH_LOGS=recompiles
row() { local name=$1 limit=$2; shift 2; timeout "$limit" python3 bench/grpo_step.py "$@" > "$out/$name.txt" 2>&1
        echo "$name: exit $?" >> "$out/rows.txt"; }
row q05 150 --shape qwen2.5-0.5b --lora 16 --precision bf16 --skip-raw
row q15 200 --shape qwen2.5-1.5b --lora 16 --precision bf16 --skip-raw
row q7-lora 220 --shape qwen2.5-7b --dtype bfloat16 --lora 16 --skip-full --skip-raw --precision bf16 --gradient-checkpointing
