"""examples/zero_shot_slices.py (issue 18): its strict/lenient scoring on written responses, and a run end to end on a
tiny character model (a couple of problems per slice)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rlvr_env.testing import build_char_tokenizer, build_tiny_model

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "zero_shot_slices.py"
spec = importlib.util.spec_from_file_location("zero_shot_slices", SCRIPT)
zero_shot_slices = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zero_shot_slices)


@pytest.mark.parametrize(("response", "answer", "expected"), [
    ("87 + 53 = 140. \\boxed{140}", "140", {"boxed": True, "strict": True, "lenient": True}),
    ("The answer is 140", "140", {"boxed": False, "strict": False, "lenient": True}),
    ("\\boxed{140} wait 141", "140", {"boxed": True, "strict": True, "lenient": False}),
    ("\\boxed{139} ... no, \\boxed{140}", "140", {"boxed": True, "strict": True, "lenient": True}),
    ("\\boxed{140} ... no, \\boxed{139}", "140", {"boxed": True, "strict": False, "lenient": False}),
    ("The answer is $\\boxed{-12}$.", "-12", {"boxed": True, "strict": True, "lenient": True}),
    ("\\boxed{87 + 53}", "140", {"boxed": True, "strict": False, "lenient": False}),  # the question restated
    ("Put your final answer within \\boxed{}. 140", "140", {"boxed": False, "strict": False, "lenient": True}),
    ("I don't know.", "140", {"boxed": False, "strict": False, "lenient": False}),
])
def test_strict_reads_the_last_box_and_lenient_the_last_number(response, answer, expected):
    assert zero_shot_slices.score(response, answer) == expected


def test_summarize_gives_shares():
    scores = [{"boxed": True, "strict": True, "lenient": False}, {"boxed": False, "strict": False, "lenient": True}]
    assert zero_shot_slices.summarize(scores) == {"n": 2, "strict": 0.5, "lenient": 0.5, "boxed": 0.5}


def test_the_script_asks_each_slice_zero_shot_and_reports_it(tmp_path):
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    out = tmp_path / "slices.json"
    result = zero_shot_slices.main(["--model", str(tmp_path / "model"), "--per-slice", "2", "--max-new-tokens", "6",
                                    "--out", str(out)])
    assert json.loads(out.read_text()) == result
    report, responses = result["report"], result["responses"]
    assert list(report) == [*zero_shot_slices.SLICES, "overall"]
    assert [row["n"] for row in report.values()] == [2, 2, 2, 6]
    for name, rows in responses.items():
        operators = zero_shot_slices.SLICES[name]["operators"]
        for row in rows:
            terms = row["expression"].split()
            assert len(terms) == 2 * zero_shot_slices.SLICES[name]["terms"] - 1
            assert all(len(t) == 2 for t in terms[::2]) and set(terms[1::2]) <= set(operators)
            assert row["answer"] == str(eval(row["expression"]))
            # the chat template around one user message (the tiny tokenizer's template: "U:...\nA:")
            assert row["prompt"] == f"U:What is {row['expression']}? Put your final answer within \\boxed{{}}.\nA:"
            assert {k: row[k] for k in ("boxed", "strict", "lenient")} == zero_shot_slices.score(row["response"],
                                                                                                  row["answer"])
    # the same seed, the same problems; another seed, others
    again = zero_shot_slices.main(["--model", str(tmp_path / "model"), "--per-slice", "2", "--max-new-tokens", "6"])
    other = zero_shot_slices.main(["--model", str(tmp_path / "model"), "--per-slice", "2", "--max-new-tokens", "6",
                                   "--seed", "7"])
    assert again["responses"] == responses and other["responses"] != responses
