"""One GRPO batch of the demo (sampled under bf16 autocast), its policy gradient in fp32, under bf16 autocast, and
under bf16 autocast with the LM head + log-softmax in fp32: the cosine to the fp32 gradient per parameter group, and
the engine/trainer log-prob gap (sums over the first micro-batch). docs/agents.md, "bf16 and the demo's gain".

    python bench/bf16_gradient.py [STEP]     # the batch of that step's seed (default 1)
"""
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
import algos.core.logprobs as lp  # noqa: E402
from algos.algorithms.grpo import GRPOConfig, GRPOTrainer, _UpdateInputs  # noqa: E402
from algos.config import load_config  # noqa: E402
from algos.learn.stats import UpdateStats  # noqa: E402
from algos.system.runtime import mixed_precision  # noqa: E402

cfg = load_config(GRPOConfig, str(Path(__file__).resolve().parents[1] / "examples" / "demo.toml"), overrides={
    "run.output_dir": tempfile.mkdtemp(), "model.autocast": "bfloat16", "run.progress": "false", "run.tensorboard": "false"})
trainer = GRPOTrainer(cfg)
with mixed_precision(cfg.model, trainer.run.device):
    batch, stats = trainer.collect(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
print("batch rows", batch.num_rows, "reward", stats.get("reward_mean"), flush=True)
mask = batch.loss_mask.float()
norms = {"global_num_tokens": mask.sum().item(), "global_num_seqs": max(1.0, (mask.sum(-1) > 0).sum().item()),
         "token_budget": cfg.env.max_new_tokens}
original_dtype = lp._matmul_dtype

def gradient(autocast, head_fp32):
    trainer.model.zero_grad(set_to_none=True)
    cfg.model.autocast = autocast
    lp._matmul_dtype = (lambda h, w: torch.float32) if head_fp32 else original_dtype
    mismatch = {}
    inputs = _UpdateInputs(batch, mask, batch.policy_mask.float(), None, None, norms, mismatch)
    with mixed_precision(cfg.model, trainer.run.device):
        for start in range(0, batch.num_rows, 8):
            rows = slice(start, min(start + 8, batch.num_rows))
            loss = trainer._micro_batch_loss(inputs, rows, stats=UpdateStats(), entropy_sums=[], measure=start == 0)
            loss.backward()
    lp._matmul_dtype = original_dtype
    return {n: p.grad.detach().double().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}, mismatch

def cosine(a, b, names):
    x, y = torch.cat([a[n].flatten() for n in names]), torch.cat([b[n].flatten() for n in names])
    return (x @ y / (x.norm() * y.norm())).item(), (x.norm() / y.norm()).item()

results = {}
started = time.time()
ref, mm_ref = gradient(None, False)
print("fp32", f"{time.time() - started:.1f}s", "mismatch", json.dumps(mm_ref), flush=True)
groups = {"all": list(ref), "embed/head": [n for n in ref if "embed" in n or "lm_head" in n],
          "layers": [n for n in ref if "layers" in n]}
for name, (autocast, head) in {"bf16": ("bfloat16", False), "bf16+fp32 head": ("bfloat16", True),
                               "fp32 head only (no autocast)": (None, True)}.items():
    started = time.time()
    g, mm = gradient(autocast, head)
    results[name] = {k: cosine(g, ref, v) for k, v in groups.items()}  # (cosine, norm ratio) to fp32's
    print(name, f"{time.time() - started:.1f}s", json.dumps(results[name]), "mismatch", json.dumps(mm), flush=True)
