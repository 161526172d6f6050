"""Zero-shot arithmetic accuracy per slice, strict and lenient (issue 18).

Asks a model held-out rlvr/Arithmetic-v0 problems the plain way a user asks them: the chat template, one user
message "What is 87 + 53? Put your final answer within \\boxed{}." (no system prompt beyond what the template adds,
no examples), greedy, --max-new-tokens new tokens. Three slices of --per-slice problems each: 2-digit addition,
2-digit subtraction or multiplication, and 3-term 2-digit expressions with + and -. Per slice and overall it reports

    strict   the last \\boxed{} of the response holds the right integer
    lenient  the last number anywhere in the response is right
    boxed    the share of responses with any filled \\boxed{}

prints a table and, with --out, writes it and every response as JSON. The i-th slice's problems come from seed
--seed + i, which neither training nor a run's periodic evaluation (env.eval_seed = 12345) draws from. Loading,
prompts and greedy batched generation are `rlvr eval`'s (algos.run.evaluation.eval_rollouts); answer extraction is the rewards'
(rewards.extract.last_boxed, rlvr_env.answers.last_number, rewards.math_equal).

    python examples/zero_shot_slices.py --model default --per-slice 100 --out zero_shot.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path

from algos.config import EvalConfig, from_dict
from algos.model.loading import load_policy, resolve_model_path
from algos.rollout import build_task, make_rollout_backend
from algos.run.evaluation import eval_rollouts, procedural_eval_indices
from algos.system.hardware import resolve_precision
from algos.system.runtime import DTYPES, mixed_precision, resolve_device
from rewards import math_equal
from rewards.extract import last_boxed
from rlvr_env.answers import last_number, unevaluated

PROMPT = "What is {expression}? Put your final answer within \\boxed{{}}."
SLICES = {  # name -> rlvr/Arithmetic-v0 config: the three kinds of question a user asks, as issue 18 lists them
    "2-digit +": {"digits": 2, "terms": 2, "operators": "+"},
    "2-digit - or *": {"digits": 2, "terms": 2, "operators": "-*"},
    "3-term +-": {"digits": 2, "terms": 3, "operators": "+-"},
}
HELD_OUT_SEED = 18_018  # issue 18's own held-out problems


def score(response: str, answer: str) -> dict[str, bool]:
    """boxed: the response fills a \\boxed{}; strict: its last box holds ``answer`` as a number (not the
    question's "87 + 53" restated); lenient: the last number written anywhere in it is ``answer``."""
    box, number = last_boxed(response), last_number(response)
    return {"boxed": box is not None,
            "strict": box is not None and not unevaluated(box) and math_equal(box, answer),
            "lenient": number is not None and math_equal(number, answer)}


def summarize(scores: list[dict[str, bool]]) -> dict[str, float]:
    n = len(scores)
    return {"n": n, **{key: sum(s[key] for s in scores) / n for key in ("strict", "lenient", "boxed")}}


def slice_config(model: str, task_kwargs: dict, seed: int, args) -> EvalConfig:
    """`rlvr eval --zero-shot`'s config for one slice: chat template on, no examples, this script's prompt."""
    return from_dict(EvalConfig, {
        "model": {"path": model},
        "env": {"id": "rlvr/Arithmetic-v0", "kwargs": {**task_kwargs, "prompt_template": PROMPT, "few_shot": []},
                "use_chat_template": True, "system_prompt": None, "max_new_tokens": args.max_new_tokens,
                "eval_size": args.per_slice, "eval_seed": seed, "eval_batch_size": args.batch_size},
    })


def run_slice(model, tokenizer, config, device) -> list[dict]:
    """Greedy responses to the slice's held-out problems, generated as `rlvr eval` generates them."""
    task, backend, records = build_task(config, held_out=True), make_rollout_backend(config), []
    for result in eval_rollouts(model, tokenizer, config, backend, device, task, procedural_eval_indices(config)):
        prompts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(result.prompt_ids, result.prompt_mask)]
        for problem, prompt, response in zip(result.problems, prompts, result.completions):
            records.append({"expression": problem.metadata["expression"], "answer": problem.answer, "prompt": prompt,
                            "response": response, **score(response, problem.answer)})
    return records


def table(report: dict[str, dict]) -> str:
    lines = [f"{'slice':<14} {'n':>4} {'strict':>7} {'lenient':>8} {'boxed':>7}"]
    for name, row in report.items():
        lines.append(f"{name:<14} {row['n']:>4} {row['strict']:>7.1%} {row['lenient']:>8.1%} {row['boxed']:>7.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="local transformers directory, run directory or 'default'")
    parser.add_argument("--per-slice", type=int, default=100, help="held-out problems per slice")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=HELD_OUT_SEED, help="held-out problem seed")
    parser.add_argument("--batch-size", type=int, default=64, help="rows generated at once (env.eval_batch_size)")
    parser.add_argument("--out", type=Path, help="JSON file for the table and every response")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the machine and the precision picked

    started = time.perf_counter()
    model_dir = str(resolve_model_path(args.model))  # "default": the embedded model, converted once
    # seed + i for the i-th slice: under one seed the 2-operand slices would draw the same operands
    configs = {name: slice_config(model_dir, kwargs, args.seed + i, args) for i, (name, kwargs) in enumerate(SLICES.items())}
    first = next(iter(configs.values()))
    device = resolve_device(first.model.device)
    model, tokenizer = load_policy(model_dir, dtype=DTYPES[first.model.dtype], device=device)
    resolve_precision(first, device, model.config)  # model.autocast "auto" -> what this machine computes fastest in
    records, report = {}, {}
    for name, config in configs.items():
        config.model = first.model
        with mixed_precision(config.model, device):
            records[name] = run_slice(model, tokenizer, config, device)
        report[name] = summarize(records[name])
    report["overall"] = summarize([r for rows in records.values() for r in rows])
    seconds = time.perf_counter() - started
    print(table(report))
    print(f"{args.model} ({model_dir}), seed {args.seed}, {args.max_new_tokens} new tokens, {seconds:.0f} s")
    result = {"model": args.model, "model_dir": model_dir, "seed": args.seed, "max_new_tokens": args.max_new_tokens,
              "prompt": PROMPT, "slices": SLICES, "report": report,
              "model_config": dataclasses.asdict(first.model), "seconds": round(seconds, 1), "responses": records}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
