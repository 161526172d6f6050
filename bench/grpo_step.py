"""Time and peak memory of one GRPO step, against baselines measured in the same run.

Work: P prompts x G samples of rlvr/Arithmetic-v0, N new tokens, beta 0, one optimizer step.
Each contender runs in its own subprocess (so peak RSS is its own) and times its second
step (the first warms up allocators and kernels):

  raw   model.generate of the P*G completions + one plain fwd/bwd/AdamW step on them with
        full-vocabulary logits: what a GRPO step costs without any care
  ours  algos.algorithms.grpo.GRPOTrainer: rollout through TokenVectorEnv + scoring + update
  trl   TRL's GRPOTrainer (when trl is installed) on the same model, prompts and budget
  ours_lora, trl_lora (--lora R): both with LoRA adapters of rank R (alpha 2R) on every linear layer, TRL through
        its peft_config: update time and memory against the full fine-tuning rows of the same run

--shape NAME times a model of a published configuration (SHAPES: Qwen2.5-0.5B/1.5B/7B, Llama-3.2-1B) with random
weights and the embedded SmolLM2 tokenizer (its ids fit every shape's vocabulary): every row decodes the whole budget
whatever the weights say (an EOS is a 1-in-100k draw), so random weights time the same work as real ones.

All run in one precision (--precision; "auto" = what model.autocast "auto" picks on this
machine) and the output names it, the machine and each contender's micro-batch: the ratios
depend on all three. Memory is peak RSS (peak GPU memory on a GPU), and the part of it the
step adds over the process after its imports ("working"). The floor is the step's matmul
FLOPs (2 x params per generated token, 6 x params per trained token, a group's prompt once)
over the matmul rate measured here on the model's own shapes in that precision.

    python bench/grpo_step.py [--model tiny|default|PATH | --shape qwen2.5-0.5b] [--lora 16] [--precision auto|fp32|bf16] ...
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from algos.system.memory import rss_gb

PRECISIONS = {"fp32": None, "bf16": "bfloat16"}  # --precision -> model.autocast
# Published configurations (the models' config.json on their hubs), the fields that set the work and the memory.
SHAPES = {
    "qwen2.5-0.5b": ("Qwen2Config", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                         max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)),
    "qwen2.5-1.5b": ("Qwen2Config", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                         max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)),
    "qwen2.5-7b": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                       max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False)),
    "llama-3.2-1b": ("LlamaConfig", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                         max_position_embeddings=131072, rope_theta=5e5, tie_word_embeddings=True,
                                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192})),
}


def peak_memory(baseline_gb: float) -> dict:
    """Peak host RSS and the part the work added over ``baseline_gb`` (the process after its imports), and on a
    GPU peak allocated GPU memory (where the model, activations and optimizer live)."""
    import torch

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is KiB on Linux
    memory = {"peak_rss_gb": peak, "working_gb": peak - baseline_gb}
    if torch.cuda.is_available():
        memory["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1024**3
    return memory


def now() -> float:
    """perf_counter after the GPU's queued work is done (optimizer steps run asynchronously on CUDA)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def tiny_model_dir(root: Path) -> str:
    from rlvr_env.testing import saved_tiny_model

    return str(saved_tiny_model(root / "tiny", hidden_size=128, num_layers=4, num_heads=4))


def shape_config(shape: str, **special_token_ids):
    """The transformers config of the published configuration ``shape``, with the tokenizer's special token ids."""
    import transformers

    class_name, fields = SHAPES[shape]
    return getattr(transformers, class_name)(**fields, **special_token_ids)


def shape_model_dir(root: Path, shape: str, dtype: str) -> str:
    """A model of the published configuration ``shape`` with random weights (in ``dtype``), and SmolLM2's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from algos.model.loading import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = shape_config(shape, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(root / shape)
    tokenizer.save_pretrained(root / shape)
    return str(root / shape)


def grpo_config(args, output_dir: str):
    from algos.algorithms.grpo import GRPOConfig
    from algos.config import load_config

    return load_config(
        GRPOConfig,
        overrides={
            "model.path": args.model, "model.dtype": args.dtype, "env.max_new_tokens": str(args.new_tokens),
            "run.output_dir": output_dir, "run.steps": "2", "run.progress": "false", "run.tensorboard": "false",
            "rollout.prompts_per_step": str(args.prompts), "rollout.group_size": str(args.group_size),
            "grpo.beta": "0", "optim.lr": "1e-6", "model.autocast": str(args.autocast or "null"),
            "model.gradient_checkpointing": str(args.gradient_checkpointing).lower(),
            **({"loss.micro_batch_size": str(args.micro_batch)} if args.micro_batch else {}),
            **({"rollout.backend": args.rollout_backend} if args.rollout_backend else {}),
            **({"model.compile_layers": args.compile_layers} if args.compile_layers else {}),
            **({"lora.r": str(args.lora_r), "lora.alpha": str(2 * args.lora_r)} if args.lora_r else {}),
        },
    )


def run_raw(args) -> dict:
    import torch

    from algos.model.loading import load_policy
    from algos.model.policy import position_ids_from_mask
    from algos.rollout import make_env

    baseline = rss_gb()
    config = grpo_config(args, tempfile.mkdtemp())
    model, tokenizer = load_policy(args.model, dtype=args.dtype)
    env = make_env(config, tokenizer, num_envs=args.prompts * args.group_size, device=next(model.parameters()).device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    times = []
    for attempt in range(2):
        env.reset(seed=attempt, options={"group_size": args.group_size})
        started = now()
        with torch.no_grad(), torch.autocast(env.prompt_ids.device.type, dtype=torch.bfloat16, enabled=bool(args.autocast)):
            out = model.generate(
                input_ids=env.prompt_ids, attention_mask=env.prompt_mask, max_new_tokens=args.new_tokens,
                do_sample=True, pad_token_id=env.pad_id,
            )
        generated = now()
        mask = (out != env.pad_id).long()
        mask[:, : env.prompt_width] = env.prompt_mask
        with torch.autocast(out.device.type, dtype=torch.bfloat16, enabled=bool(args.autocast)):
            logits = model(input_ids=out, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        logp = torch.log_softmax(logits[:, env.prompt_width - 1 : -1].float(), -1)
        taken = logp.gather(-1, out[:, env.prompt_width :, None]).squeeze(-1)
        (-(taken * mask[:, env.prompt_width :]).sum() / mask[:, env.prompt_width :].sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append((generated - started, now() - generated))
    gen, train = times[-1]
    return {"generate_s": gen, "train_s": train, "step_s": gen + train, **peak_memory(baseline)}


def exit_reason(returncode: int) -> str:
    """A contender's exit status in words: a SIGKILL is most often the kernel's OOM killer (raw's full-vocabulary
    logits of 64 rows x 128 new tokens take ~24 GB), which leaves no Python traceback to read."""
    if returncode >= 0:
        return f"exit status {returncode}"
    name = signal.Signals(-returncode).name
    return f"killed by {name}" + (": out of memory?" if name == "SIGKILL" else "")


def run_ours(args) -> dict:
    from algos.algorithms.grpo import GRPOTrainer
    from algos.system.runtime import mixed_precision

    baseline = rss_gb()
    trainer = GRPOTrainer(grpo_config(args, tempfile.mkdtemp()))
    times = []
    for step in (1, 2):
        started = now()
        with mixed_precision(trainer.config.model, trainer.run.device):  # as run_training does
            batch, _ = trainer.collect(step)
            collected = now()
            metrics = trainer.update(batch) if batch is not None else {}
        times.append((collected - started, now() - collected))
    gen, train = times[-1]
    # The work the floor counts: each group's prompt once, every completion token.
    prompts = batch.attention_mask[:, : batch.prompt_width].sum(-1)[:: args.group_size]
    work = {"prompt_tokens": int(prompts.sum()), "completion_tokens": int(batch.attention_mask[:, batch.prompt_width :].sum()),
            "params": sum(p.numel() for p in trainer.model.parameters()),
            # loss.micro_batch_size "auto" resolves per step (8 rows on a CPU, what fits on a GPU): the rows it took
            "micro_batch": int(metrics.get("micro_batch_rows", 0)) or trainer.config.loss.micro_batch_size}
    return {"generate_s": gen, "train_s": train, "step_s": gen + train, **work, **peak_memory(baseline)}


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from algos.model.loading import load_policy
    from rlvr_env import make_task

    baseline = rss_gb()
    model, tokenizer = load_policy(args.model, dtype=args.dtype)
    task = make_task("rlvr/Arithmetic-v0")
    problems = [task.problem(i, 0) for i in range(args.prompts * 4)]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p.prompt}], "answer": p.answer} for p in problems]
    )

    def reward(completions, answer, **_):
        return [task.verifier(c[0]["content"], answer=a).score for c, a in zip(completions, answer)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times = []

        def on_step_begin(self, *_, **__):
            self.started = now()

        def on_step_end(self, *_, **__):
            self.times.append(now() - self.started)

    timer = StepTimer()
    # One optimizer step on P*G completions: generated at once, trained in micro-batches of
    # --trl-micro-batch rows with gradient accumulation (default: all rows at once).
    rows = args.prompts * args.group_size
    micro = args.trl_micro_batch or rows
    config = TRLConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=micro, gradient_accumulation_steps=rows // micro,
        num_generations=args.group_size, max_completion_length=args.new_tokens, max_steps=2, beta=0.0,
        learning_rate=1e-6, report_to="none", logging_steps=1, save_strategy="no",
        use_cpu=not torch.cuda.is_available(),  # on the device ours and raw use
        bf16=args.autocast == "bfloat16",  # Trainer's bf16 is autocast over fp32 weights, as ours
        gradient_checkpointing=args.gradient_checkpointing,
    )
    peft_config = None
    if args.lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    trainer = TRLTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer,
        callbacks=[timer], peft_config=peft_config,
    )
    trainer.train()
    return {"step_s": timer.times[-1], **peak_memory(baseline)}


def matmul_floor_s(work: dict, model_dir: str, autocast: str | None) -> tuple[float, float]:
    """(seconds the step's matmul FLOPs take at the rate measured here, that rate in GFLOP/s)."""
    from transformers import AutoConfig

    from algos.system.hardware import cpu_matmul_ms

    config = AutoConfig.from_pretrained(model_dir)
    rows, inner, cols = 512, config.hidden_size, config.intermediate_size  # a training micro-batch's MLP matmul
    rate = 2 * rows * inner * cols / (cpu_matmul_ms(autocast or "float32", rows, inner, cols) / 1e3)
    completions, prompts, params = work["completion_tokens"], work["prompt_tokens"], work["params"]
    flops = 2 * params * (prompts + completions) + 6 * params * (prompts + completions)  # generate, then train
    return flops / rate, rate / 1e9


def bench_autocast(args, model_dir: str) -> tuple[str | None, str]:
    """--precision as model.autocast, and why (for "auto", what algos.system.hardware picks on this machine)."""
    import torch
    from transformers import AutoConfig

    from algos.system.hardware import resolve_autocast

    if args.precision != "auto":
        return PRECISIONS[args.precision], f"--precision {args.precision}"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    choice = resolve_autocast("auto", device, AutoConfig.from_pretrained(model_dir))
    return choice.autocast, f"auto: {choice.reason}"


def run_ours_hf(args) -> dict:
    """Ours with the "hf" rollout engine (the GPU's default before the static engine): the before of a GPU table."""
    args.rollout_backend = "hf"
    return run_ours(args)


def run_ours_eager(args) -> dict:
    """Ours with model.compile_layers "off" (on a GPU "auto" compiles them): the before of the compiled update."""
    args.compile_layers = "off"
    return run_ours(args)


def run_ours_lora(args) -> dict:
    """Ours with LoRA of rank --lora on every linear layer."""
    args.lora_r = args.lora
    return run_ours(args)


def run_trl_lora(args) -> dict:
    """TRL with the same LoRA through its peft_config."""
    args.lora_r = args.lora
    return run_trl(args)


CONTENDERS = {"raw": run_raw, "ours": run_ours, "ours_eager": run_ours_eager, "ours_hf": run_ours_hf, "trl": run_trl,
              "ours_lora": run_ours_lora, "trl_lora": run_trl_lora}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """This bench's flags, from ``argv`` (the command line's by default): tests/test_bench.py parses the GPU scripts'
    command lines with it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally), 'default' (SmolLM2) or a directory")
    parser.add_argument("--dtype", default="float32", help="weights and AdamW state (model.dtype)")
    parser.add_argument("--precision", choices=["auto", *PRECISIONS], default="auto",
                        help="matmuls of every contender: fp32, bf16 autocast, or what model.autocast 'auto' picks here")
    parser.add_argument("--autocast", help=argparse.SUPPRESS)  # --precision resolved, passed to each contender
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=0, help="rows per forward/backward in ours (0 = its config default)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="ours and trl (model.gradient_checkpointing)")
    parser.add_argument("--trl-micro-batch", type=int, default=0,
                        help="rows per forward/backward in TRL (0 = the whole batch, as TRL's examples run GRPO)")
    parser.add_argument("--only", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)  # one contender, JSON out
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--with-hf-rollout", action="store_true",
                        help="also ours with rollout.backend = 'hf' (ours_hf): on a GPU, ours before the static engine")
    parser.add_argument("--rollout-backend", help=argparse.SUPPRESS)  # set by ours_hf
    parser.add_argument("--with-eager-layers", action="store_true",
                        help="also ours with model.compile_layers = 'off' (ours_eager): on a GPU, ours before compiling")
    parser.add_argument("--compile-layers", help=argparse.SUPPRESS)  # set by ours_eager
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a published configuration with random weights")
    parser.add_argument("--lora", type=int, default=0, help="also ours_lora and trl_lora: LoRA of this rank (alpha 2x)")
    parser.add_argument("--lora-r", type=int, default=0, help=argparse.SUPPRESS)  # set by the *_lora contenders
    parser.add_argument("--skip-raw", action="store_true", help="leave out the raw contender (a large shape's memory)")
    parser.add_argument("--skip-full", action="store_true",
                        help="with --lora: leave out full fine-tuning (ours, trl), for a shape whose AdamW state won't fit")
    args = parser.parse_args(argv)
    if args.skip_full and not args.lora:
        parser.error("--skip-full leaves nothing to time without --lora R")
    return args


def main() -> None:
    args = parse_args()

    if args.only:
        print(json.dumps(CONTENDERS[args.only](args)))
        return
    import torch

    from algos.system.hardware import describe_machine

    root = Path(tempfile.mkdtemp())
    if args.shape:
        model = shape_model_dir(root, args.shape, args.dtype)
    else:
        model = tiny_model_dir(root) if args.model == "tiny" else args.model
    if model == "default":
        from algos.model.loading import default_model_path

        model = str(default_model_path())
    autocast, why = bench_autocast(args, model)
    base = [sys.executable, __file__, "--model", model, "--dtype", args.dtype, "--prompts", str(args.prompts),
            "--group-size", str(args.group_size), "--new-tokens", str(args.new_tokens), "--autocast", str(autocast or ""),
            "--micro-batch", str(args.micro_batch), "--trl-micro-batch", str(args.trl_micro_batch),
            "--lora", str(args.lora),
            *(["--gradient-checkpointing"] if args.gradient_checkpointing else [])]
    results = {}
    skipped = {"ours": args.skip_full, "trl": args.skip_trl or args.skip_full, "ours_hf": not args.with_hf_rollout,
               "ours_eager": not args.with_eager_layers,
               "ours_lora": not args.lora, "trl_lora": args.skip_trl or not args.lora, "raw": args.skip_raw}
    for name in CONTENDERS:
        if skipped.get(name):
            continue
        proc = subprocess.run([*base, "--only", name], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name}: failed ({exit_reason(proc.returncode)})\n{proc.stderr[-1500:]}", file=sys.stderr)
            continue
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)  # kept if a later contender hangs
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    machine = describe_machine(device)
    print(f"machine: {machine.get('gpu') or machine['cpu']}, CPU capability {machine['cpu_capability']}, bf16 units "
          f"{'/'.join(machine['cpu_bf16_units']) or 'none'}, {machine['torch_threads']} threads, torch {machine['torch']}")
    print(f"precision: weights {args.dtype}, matmuls {autocast or 'float32'} ({why})")
    ours_micro = results.get("ours", {}).get("micro_batch", args.micro_batch or "default")
    print(f"one GRPO step: {args.prompts} prompts x {args.group_size} samples, {args.new_tokens} new tokens, model "
          f"{args.shape or args.model}{' (random weights)' if args.shape else ''}, beta 0; rows per forward/backward: "
          f"raw all {args.prompts * args.group_size}, ours {ours_micro}, "
          f"trl {args.trl_micro_batch or f'all {args.prompts * args.group_size}'}; gradient checkpointing "
          f"{'on' if args.gradient_checkpointing else 'off'}")
    raw = results.get("raw")
    memory = "peak_gpu_gb" if all("peak_gpu_gb" in r for r in results.values()) else "peak_rss_gb"  # what ratios compare
    for name, r in results.items():
        line = f"  {name:9s} step {r['step_s']:7.2f} s  peak RSS {r['peak_rss_gb']:6.2f} GB (working {r['working_gb']:5.2f})"
        if "peak_gpu_gb" in r:
            line += f"  peak GPU {r['peak_gpu_gb']:6.2f} GB"
        if "generate_s" in r:
            line += f"  (generate {r['generate_s']:.2f} s + train {r['train_s']:.2f} s)"
        if raw and name != "raw":
            line += f"  | x{r['step_s'] / raw['step_s']:.2f} time, x{r[memory] / raw[memory]:.2f} memory vs raw"
        print(line)
    if "ours" in results and device.type == "cpu":
        floor, rate = matmul_floor_s(results["ours"], model, autocast)
        print(f"  floor: {floor:.2f} s of matmul FLOPs at {rate:.0f} GFLOP/s (measured here); "
              + ", ".join(f"{name} x{r['step_s'] / floor:.2f}" for name, r in results.items()))
    # The targets: on a CPU <= 0.4x TRL's time and <= 0.3x its memory; on a GPU <= 0.5x its time, <= its memory.
    time_target, memory_target = (0.5, 1.0) if device.type == "cuda" else (0.4, 0.3)
    if "ours_lora" in results and "ours" in results:
        lora, full = results["ours_lora"], results["ours"]
        print(f"  ours_lora / ours: x{lora['train_s'] / full['train_s']:.2f} update time, x{lora[memory] / full[memory]:.2f} "
              f"{memory} (target <= 0.6: {'met' if lora[memory] / full[memory] <= 0.6 else 'NOT met'}), "
              f"x{lora['working_gb'] / full['working_gb']:.2f} working memory")
    for name, baseline in (("ours", "trl"), ("ours_eager", "trl"), ("ours_hf", "trl"), ("ours_lora", "trl_lora")):
        if name in results and baseline in results:
            ours, trl = results[name], results[baseline]
            time_ratio, memory_ratio = ours["step_s"] / trl["step_s"], ours[memory] / trl[memory]
            print(f"  {name} / {baseline}: x{time_ratio:.2f} time (target <= {time_target}: "
                  f"{'met' if time_ratio <= time_target else 'NOT met'}), x{memory_ratio:.2f} {memory} (target <= "
                  f"{memory_target}: {'met' if memory_ratio <= memory_target else 'NOT met'}), "
                  f"x{ours['working_gb'] / trl['working_gb']:.2f} working memory")


if __name__ == "__main__":
    main()
