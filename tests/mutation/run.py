"""Mutation testing with mutmut, one module at a time, each against the tests that cover it.

    .venv/bin/python tests/mutation/run.py                       # every module in MODULES, in order
    .venv/bin/python tests/mutation/run.py algos/core/gae.py     # one (or a few) of them
    .venv/bin/python tests/mutation/run.py algos/run/loop.py --mutants 'algos.run.loop.x_setup_run__mutmut_*'
                                                                 # one module's mutants whose names match
    make mutation [MODULE=algos/core/gae.py]                     # the same through the Makefile

Each module runs in its own directory, mutants/<module>/ (e.g. mutants/algos.core.gae/): symlinks to
the project's packages and tests, and a pyproject.toml that is the project's with [tool.mutmut]
narrowed to that module (only_mutate) and its test files (pytest_add_cli_args_test_selection). The
shared settings (source_paths, also_copy, pytest_add_cli_args) stay in the project's [tool.mutmut].
mutmut then copies the project into mutants/<module>/mutants/ and mutates that copy; it runs each
mutant against only those of the module's tests that call the mutated function.

A module's directory is rebuilt on every run (mutmut's cache does not notice a changed test body).
After a run, inspect it with mutmut itself:

    cd mutants/algos.core.gae && ../../.venv/bin/mutmut results      # or: show <mutant>, browse

Per module this prints the counts and the score killed / (total - skipped), and writes
mutants/<module>/survivors.txt (each mutant not killed, with its diff) and result.json;
mutants/summary.md collects every module's latest result, each survivor condensed to one line.

To add a test file to a module's scope, add it to the module's row in MODULES. A listed file that
does not exist (yet) is skipped with a warning. Only fast tests run (-m "not slow", in pyproject.toml).

mutmut 3.8.1 leaves decorated functions alone (all but @staticmethod/@classmethod): @property
getters get no mutants and count in no score; that is why the loops use `with torch.no_grad():` blocks
and algos/core registers its variants by a call rather than a decorator.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "mutants"

# module -> the test files that exercise it. mutmut runs, per mutant, only those of these tests that
# call the mutated function, so listing a broad file costs stats-collection time, not per-mutant time.
# The reference-gradient tests pin what the loops compute from the core: every core module and loop lists them.
GRPO_REFERENCE = ["tests/test_reference_gradients.py"]
PPO_REFERENCE = ["tests/test_reference_gradients_ppo.py"]
RESUME = ["tests/test_resume_state.py"]
CORE_USERS = ["tests/test_grpo_loop.py", "tests/test_ppo.py", *GRPO_REFERENCE, *PPO_REFERENCE]
# The answer checker's tests: extraction, equivalence (with math-verify's own cases), and hostile model output.
VERIFIER_TESTS = ["tests/test_rewards_extraction.py", "tests/test_rewards_equivalence.py",
                  "tests/test_rewards_equivalence_edges.py", "tests/test_rewards_robustness.py",
                  "tests/test_math_verify_suite.py", "tests/test_rewards_safety.py", "tests/test_rewards_mathcheck.py",
                  "tests/test_rewards_compare.py", "tests/test_rewards_latex.py", "tests/test_rewards_renderings.py"]
TASK_TESTS = ["tests/test_tasks.py", "tests/test_task_countdown.py", "tests/test_task_arithmetic.py",
              "tests/test_env_task_edges.py", "tests/test_env.py"]
MODULES: dict[str, list[str]] = {
    "algos/core/variants.py": ["tests/test_core_variants.py", "tests/test_config.py", *CORE_USERS],
    "algos/core/advantages.py": ["tests/test_core_advantages.py", *CORE_USERS],
    "algos/core/aggregation.py": ["tests/test_core_aggregation.py", *CORE_USERS],
    "algos/core/gae.py": ["tests/test_gae.py", "tests/test_ppo.py", *PPO_REFERENCE, *RESUME],
    "algos/core/kl.py": ["tests/test_core_kl.py", *CORE_USERS],
    "algos/core/policy_loss.py": ["tests/test_core_policy_loss.py", "tests/test_core_aggregation.py", *CORE_USERS],
    "algos/core/logprobs.py": ["tests/test_core_logprobs.py", "tests/test_grpo_machinery.py", *CORE_USERS],
    "algos/core/importance_weights.py": ["tests/test_core_importance_weights.py", "tests/test_grpo_loop.py"],
    "algos/core/preference.py": ["tests/test_dpo.py"],
    "algos/core/sampled_accuracy.py": ["tests/test_sampled_eval.py"],
    "algos/core/padding.py": ["tests/test_core_padding.py", "tests/test_warm_start.py", "tests/test_multiturn_rollout.py"],
    "algos/algorithms/dpo.py": ["tests/test_dpo.py", "tests/test_rollout_pipeline.py"],
    "algos/rollout/static.py": ["tests/test_static_rollout.py", "tests/test_multiturn_rollout.py"],
    "algos/rollout/multiturn.py": ["tests/test_multiturn_episode.py", "tests/test_multiturn_rollout.py",
                                   "tests/test_ppo_multiturn.py"],
    # a first run (553 mutants) on the first five files alone: 61.8%, its 32 "no tests" the warm start's; the files
    # after them reach run_training's evaluation schedule, env.schedule, the alarms and the warm start
    "algos/run/loop.py": ["tests/test_grpo_loop.py", "tests/test_ppo.py", "tests/test_dpo.py", "tests/test_grpo_cli.py",
                          *RESUME, "tests/test_alarms.py", "tests/test_warm_start.py", "tests/test_recipes.py",
                          "tests/test_run_dir.py", "tests/test_best_model.py", "tests/test_lora.py",
                          "tests/test_weight_dither.py", "tests/test_rollout_pipeline.py"],
    "algos/run/best_model.py": ["tests/test_best_model.py"],
    "algos/run/reporting.py": ["tests/test_reporting.py", "tests/test_grpo_loop.py", "tests/test_grpo_cli.py",
                               "tests/test_warm_start.py", "tests/test_alarms.py"],
    "algos/run/alarms.py": ["tests/test_alarms.py"],
    "algos/run/resolve.py": ["tests/test_run_resolve.py", "tests/test_grpo_loop.py", "tests/test_run_dir.py"],
    "algos/run/rollout_pipeline.py": ["tests/test_rollout_pipeline.py", "tests/test_dpo.py"],
    "algos/model/attention.py": ["tests/test_grpo_machinery.py", "tests/test_rollout.py"],
    "algos/model/compiled.py": ["tests/test_grpo_machinery.py", "tests/test_hardware.py", "tests/test_lora.py"],
    "algos/model/dither.py": ["tests/test_weight_dither.py"],
    "algos/model/policy.py": ["tests/test_grpo_machinery.py", "tests/test_core_logprobs.py", *CORE_USERS],
    "algos/model/lora.py": ["tests/test_lora.py"],
    "algos/algorithms/grpo.py": ["tests/test_grpo_loop.py", "tests/test_grpo_machinery.py", "tests/test_ppo.py",
                                 "tests/test_config.py", "tests/test_memory.py", *GRPO_REFERENCE, *RESUME],
    "algos/algorithms/ppo.py": ["tests/test_ppo.py", "tests/test_config.py", "tests/test_rollout_pipeline.py",
                                "tests/test_architectures.py", *PPO_REFERENCE, *RESUME],
    "algos/config.py": ["tests/test_config.py", "tests/test_config_rules.py", "tests/test_grpo_cli.py",
                        "tests/test_best_model.py"],
    "algos/run/directory.py": ["tests/test_run_dir.py", "tests/test_grpo_loop.py", "tests/test_ppo.py",
                               "tests/test_grpo_cli.py", "tests/test_warm_start.py", "tests/test_best_model.py", *RESUME],
    "algos/run/warm_start.py": ["tests/test_warm_start.py"],
    "algos/run/reward_model.py": ["tests/test_reward_model.py"],
    "algos/run/evaluation.py": ["tests/test_evaluation.py", "tests/test_recipes.py", "tests/test_grpo_cli.py",
                                "tests/test_sampled_eval.py"],
    "algos/system/hardware.py": ["tests/test_hardware.py"],
    "algos/system/memory.py": ["tests/test_memory.py"],
    "algos/learn/engine.py": ["tests/test_learn_engine.py", "tests/test_warm_start.py", *CORE_USERS, *RESUME],
    "algos/learn/micro_batches.py": ["tests/test_memory.py", "tests/test_ppo.py"],
    "algos/system/paths.py": ["tests/test_checkpoint.py", "tests/test_models.py", "tests/test_run_dir.py"],
    "algos/learn/rollout_correction.py": ["tests/test_learn_rollout_correction.py", "tests/test_core_importance_weights.py",
                                          "tests/test_grpo_loop.py", "tests/test_ppo.py"],
    "algos/run/checkpoint.py": ["tests/test_checkpoint.py", "tests/test_grpo_machinery.py", *CORE_USERS, *RESUME],
    "rewards/extract.py": VERIFIER_TESTS,
    "rewards/mathcheck.py": [*VERIFIER_TESTS, "tests/test_math_verify_backend.py", "tests/test_sampled_eval.py"],
    "rewards/compare.py": VERIFIER_TESTS,
    "rewards/latex.py": VERIFIER_TESTS,
    "rlvr_env/tasks/countdown.py": TASK_TESTS,
    "rlvr_env/tasks/arithmetic.py": TASK_TESTS,
    "rlvr_env/tasks/gsm8k.py": [*TASK_TESTS, "tests/test_env_data_files.py"],
    "rlvr_env/tasks/competition_math.py": [*TASK_TESTS, "tests/test_env_data_files.py"],
    "rlvr_env/tasks/dataset.py": [*TASK_TESTS, "tests/test_task_dataset.py"],
    "rlvr_env/data.py": [*TASK_TESTS, "tests/test_env_data_files.py", "tests/test_task_dataset.py"],
    "rewards/imported.py": ["tests/test_task_dataset.py", "tests/test_rewards_cli.py"],
    "rlvr_env/tasks/guess_number.py": [*TASK_TESTS, "tests/test_env_multiturn.py", "tests/test_task_guess_number.py"],
    "rewards/run_cgroup.py": ["tests/test_code_sandbox_limits.py"],
    "rewards/shaping.py": ["tests/test_rewards_shaping.py", "tests/test_grpo_loop.py", *GRPO_REFERENCE],
}


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def mutmut_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def module_pyproject(module: str, tests: list[str]) -> str:
    """The project's pyproject.toml with its [tool.mutmut] table narrowed to `module` and `tests`."""
    text = (ROOT / "pyproject.toml").read_text()
    # drop the [tool.mutmut] table (up to the next table header or the end of the file)
    text = re.sub(r"^\[tool\.mutmut\]\n(?:(?!\[).*\n?)*", "", text, flags=re.M)
    cfg = dict(mutmut_config(), only_mutate=[module], pytest_add_cli_args_test_selection=tests)
    # json.dumps writes strings, numbers, booleans and lists of them as valid TOML
    lines = [f"{key} = {json.dumps(value)}" for key, value in cfg.items()]
    return text.rstrip("\n") + "\n\n[tool.mutmut]\n" + "\n".join(lines) + "\n"


def prepare(module: str, tests: list[str]) -> Path:
    cfg = mutmut_config()
    d = WORK / slug(module)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for top in {Path(p).parts[0] for p in [*cfg["source_paths"], *cfg.get("also_copy", []), "tests"]}:
        (d / top).symlink_to(ROOT / top)
    (d / "pyproject.toml").write_text(module_pyproject(module, tests))
    return d


def mutmut(d: Path, *args: str, log=None) -> str:
    exe = Path(sys.executable).with_name("mutmut")
    r = subprocess.run([str(exe), *args], cwd=d, text=True, stdout=log or subprocess.PIPE,
                       stderr=subprocess.STDOUT if log is None else log)
    if r.returncode != 0:
        tail = (d / "mutmut-run.log").read_text()[-3000:] if log else r.stdout[-3000:]
        raise RuntimeError(f"mutmut {' '.join(args)} failed in {d} (exit {r.returncode}):\n{tail}")
    return r.stdout or ""


def one_line(diff: str, context: int = 16) -> str:
    """A `mutmut show` diff in one line: 'old' -> 'new', the changed part of the line with a little context."""
    old = " / ".join(ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---"))
    new = " / ".join(ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    s = 0
    while s < min(len(old), len(new)) - p and old[-1 - s] == new[-1 - s]:
        s += 1
    p, s = max(0, p - context), max(0, s - context)
    cut = lambda text: ("…" if p else "") + text[p:len(text) - s] + ("…" if s else "")  # noqa: E731
    return f"{cut(old)!r} -> {cut(new)!r}"


def run_module(module: str, tests: list[str], max_children: int, selection: Sequence[str] = ()) -> dict:
    """Mutate `module` and run its mutants (those whose names match one of `selection`'s globs, or all of them)
    against `tests`; the counts and score cover only the mutants run."""
    present = [t for t in tests if (ROOT / t).is_file()]
    for t in sorted(set(tests) - set(present)):
        print(f"  warning: {t} does not exist, left out of {module}'s scope", flush=True)
    if not present:
        raise SystemExit(f"{module}: none of its test files exist")
    d = prepare(module, present)
    start = time.monotonic()
    with open(d / "mutmut-run.log", "w") as log:
        mutmut(d, "run", "--max-children", str(max_children), *selection, log=log)
    wall = time.monotonic() - start

    from mutmut.stats import status_by_exit_code  # mutmut's own reading of its exit codes

    codes: dict[str, int | None] = {}
    for meta in (d / "mutants").rglob("*.py.meta"):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    # a mutant left out of the selection would count as "not checked": it is not in this run's result at all
    status = {name: status_by_exit_code[code] for name, code in codes.items()
              if not selection or any(fnmatch.fnmatchcase(name, glob) for glob in selection)}
    counts = {s: sum(1 for v in status.values() if v == s)
              for s in ("killed", "survived", "timeout", "suspicious", "no tests", "skipped", "segfault", "not checked")}
    total = len(status)
    tested = total - counts["skipped"]
    score = counts["killed"] / tested if tested else float("nan")

    lines, report = [], []
    for name in sorted((n for n, s in status.items() if s != "killed"), key=_natural):
        diff = mutmut(d, "show", name)
        report.append(diff)
        lines.append(f"{name} [{status[name]}]: {one_line(diff)}")
    (d / "survivors.txt").write_text("\n".join(report))
    result = dict(module=module, tests=present, selection=list(selection), wall_s=wall, total=total, score=score,
                  survivors=lines, **counts)
    (d / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def summary_line(r: dict) -> str:
    selection = r.get("selection") or []
    of = (f" (only {' '.join(selection)})" if len(selection) <= 3
          else f" (only the mutants {len(selection)} names or globs match)") if selection else ""
    return (f"{r['module']}{of}: {r['wall_s']:.0f}s, {r['total']} mutants, killed {r['killed']}, survived {r['survived']}, "
            f"timeout {r['timeout']}, suspicious {r['suspicious']}, no tests {r['no tests']}, skipped {r['skipped']}, "
            f"score {r['score']:.1%}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help=f"modules to mutate (default: all of {', '.join(MODULES)})")
    p.add_argument("--max-children", type=int, default=os.cpu_count() or 2, help="parallel mutant workers")
    p.add_argument("--mutants", nargs="+", default=[], metavar="GLOB",
                   help="run only the mutants these names or globs match (one module; names as `mutmut results` "
                        "prints them, e.g. 'algos.run.loop.x_setup_run__mutmut_*')")
    args = p.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        p.error(f"not in MODULES: {unknown}; add a row (module -> its test files) to {__file__}")
    if args.mutants and len(args.modules) != 1:
        p.error(f"--mutants selects mutants of one module; name exactly one (got {len(args.modules)})")
    # one intra-op thread per torch process: --max-children workers share the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

    for module in args.modules or list(MODULES):
        print(f"== {module}", flush=True)
        r = run_module(module, MODULES[module], args.max_children, args.mutants)
        print("  " + summary_line(r), flush=True)
        for line in r["survivors"]:
            print("    " + line, flush=True)

    # the summary covers every module with a result, from this run or an earlier one
    results = [json.loads(f.read_text()) for m in MODULES if (f := WORK / slug(m) / "result.json").is_file()]
    md = ["# mutmut results", ""] + [f"- {summary_line(r)}" for r in results]
    for r in results:
        md += ["", f"## {r['module']} (tests: {', '.join(r['tests'])})", ""] + [f"- `{s}`" for s in r["survivors"]]
    (WORK / "summary.md").write_text("\n".join(md) + "\n")
    print(f"\nsummary: {WORK / 'summary.md'}; diffs: mutants/<module>/survivors.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
