"""The example scripts run as their docstrings say (tiny local models, a step or two)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_env.testing import build_char_tokenizer, build_tiny_model

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name, *args):
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_compare_algorithms_writes_a_table_and_a_plot_for_each_algorithm(tmp_path):
    model = tmp_path / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(model)
    tokenizer.save_pretrained(model)
    out = tmp_path / "compare"
    run_example("compare_algorithms.py", "--model", str(model), "--out", str(out), "--no-chat-template", "--steps", "1",
                "--prompts", "2", "--samples", "2", "--max-new-tokens", "4", "--eval-size", "4")
    rows = [line for line in (out / "comparison.md").read_text().splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["PPO", "GRPO", "DAPO"]
    assert (out / "comparison.png").stat().st_size > 0


@pytest.mark.slow
def test_dapo_ablation_writes_a_row_per_part_with_each_seed(tmp_path):
    out = tmp_path / "ablation"
    run_example("dapo_ablation.py", "--seeds", "2", "--steps", "1", "--prompts", "2", "--group-size", "2",
                "--eval-size", "4", "--out", str(out))
    rows = [line for line in (out / "ablation.md").read_text().splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == [
        "GRPO", "+ overlong filtering", "+ clip-higher", "+ soft overlong punishment", "+ token-level loss",
        "+ dynamic sampling"]
    assert (out / "ablation.png").stat().st_size > 0


def test_train_reward_model_saves_the_model_it_reports_on(tmp_path):
    import random
    import runpy

    from algos.model.reward import RewardModel, preference_accuracy

    stdout = run_example("train_reward_model.py", "--out", str(tmp_path / "rm"), "--num-pairs", "32",
                         "--reward_model.epochs", "1")
    report = json.loads(stdout[stdout.index("{") : stdout.rindex("}") + 1])
    # The script's held-out pairs, drawn as it draws them (seed 0, the first 20% after its shuffle).
    pairs = runpy.run_path(str(EXAMPLES / "train_reward_model.py"))["synthetic_format_pairs"](32, 0)
    random.Random(0).shuffle(pairs)
    held_out = pairs[: report["held_out_pairs"]]
    reloaded = RewardModel.from_pretrained(tmp_path / "rm")
    assert preference_accuracy(reloaded, held_out) == pytest.approx(report["held_out_accuracy_after"])
