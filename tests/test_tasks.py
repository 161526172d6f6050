"""Tasks: determinism, gold self-tests, reward components, config and data file errors."""

import json
import shutil
from pathlib import Path

import pytest

import rlvr_env
from rlvr_env.data import DataFileError
from rlvr_env.tasks.arithmetic import worked_solution
from rlvr_env.tasks.countdown import ExpressionError, evaluate_expression

DATA = Path(__file__).parent / "data"
GSM8K = DATA / "gsm8k_tiny.jsonl"
MATH = DATA / "math_tiny.jsonl"
ROWS = DATA / "dataset_tiny.jsonl"

TASKS = {
    "Arithmetic": {},
    "Arithmetic-hard": {"digits": 3, "terms": 5, "operators": "+-*/"},
    "Arithmetic-worked": {"digits": 3, "terms": 4, "operators": "+-*/", "worked_solutions": True},
    "Countdown": {},
    "GSM8K": {"data_path": str(GSM8K)},
    "MATH": {"data_path": str(MATH)},
    "Dataset": {"data_path": str(ROWS)},
    "CalculatorArithmetic": {},
    "Code": {},
    "GuessNumber": {},
}


def make(key):
    return rlvr_env.make_task(key.split("-")[0], **TASKS[key])


@pytest.mark.parametrize("key", TASKS)
def test_gold_completion_scores_one(key):
    task = make(key)
    for index in range(min(task.size or 20, 20)):
        problem = task.problem(index, seed=3)
        result = task.verifier(task.gold_completion(problem), answer=problem.answer)
        assert result.score == pytest.approx(1.0), (problem, result)
        assert result.status == "ok" and task.is_success(result)


@pytest.mark.parametrize("key", TASKS)
def test_problems_are_deterministic_in_seed_and_index(key):
    first, second = make(key), make(key)
    size = first.size or 1000
    # item i is fetched directly, in any order, and equals itself across instances
    assert [first.problem(i % size, 7) for i in (5, 1, 9)] == [second.problem(i % size, 7) for i in (5, 1, 9)]
    if first.size is None:
        assert first.problem(1, 7) != first.problem(1, 8)
        assert first.problem(1, 7) != first.problem(2, 7)


def test_arithmetic_reward_components_and_lenient_answer():
    task = rlvr_env.make_task("Arithmetic")
    problem = task.problem(0, 0)
    answer = problem.answer
    lenient = task.verifier(f"I add them and get {answer}", answer=problem.answer)
    assert lenient.details["components"] == {"correct": 1.0, "format": 0.0}
    assert lenient.score == pytest.approx(0.9)
    boxed_wrong = task.verifier("\\boxed{0}", answer=problem.answer)
    assert boxed_wrong.details["components"] == {"correct": 0.0, "format": 1.0}
    assert not task.is_success(boxed_wrong)
    # the last number decides, not any number the completion happens to mention
    assert task.verifier(f"{answer} is not it, it is 12345", answer=problem.answer).details["components"]["correct"] == 0.0
    strict = rlvr_env.make_task("Arithmetic", fallback_last_number=False, format_weight=0.0, correct_weight=1.0)
    result = strict.verifier(f"Working it out step by step...\nso we get {answer}", answer=problem.answer)
    assert result.score == 0.0 and result.status == "no_answer"


@pytest.mark.parametrize(
    "completion, correct",
    [
        ("{e}", 0.0),                          # echoing the question: what GRPO on SmolLM2 found in 8 steps
        ("\\boxed{{{e}}}", 0.0),
        ("The answer is {e}", 0.0),
        ("{e} = {e}", 0.0),
        ("\\boxed{{\\frac{{{double}}}{{2}}}}", 0.0),
        ("{e} = {a}", 1.0),                    # the working, then the value
        ("\\boxed{{{a}}}", 1.0),
        ("The sum is {a}.", 1.0),
    ],
)
def test_arithmetic_answer_must_be_a_number_not_the_expression(completion, correct):
    task = rlvr_env.make_task("Arithmetic", digits=2)
    problem = task.problem(0, 0)
    text = completion.format(e=problem.metadata["expression"], a=problem.answer, double=2 * int(problem.answer))
    assert task.verifier(text, answer=problem.answer).details["components"]["correct"] == correct
    # without the rule an unevaluated expression counts, as it does for MATH-style answers
    lax = rlvr_env.make_task("Arithmetic", digits=2, literal_answer=False)
    assert lax.verifier(text, answer=problem.answer).details["components"]["correct"] == 1.0


def test_arithmetic_difficulty_knobs_and_prompt():
    task = rlvr_env.make_task(
        "Arithmetic", digits=3, terms=4, operators="*", prompt_template="Compute {expression}.",
        system_prompt="You are careful.", few_shot=[["Compute 1 * 2.", "\\boxed{2}"]],
    )
    problem = task.problem(11, 0)
    numbers = problem.metadata["expression"].split(" * ")
    assert len(numbers) == 4 and all(len(n) == 3 for n in numbers)
    assert problem.prompt == f"Compute {problem.metadata['expression']}."
    roles = [m["role"] for m in task.messages(problem)]
    assert roles == ["system", "user", "assistant", "user"]


def test_arithmetic_kinds_mix_question_shapes_and_leave_a_plain_config_alone():
    kinds = [{"operators": "+"}, {"operators": "-*"}, {"terms": 3, "operators": "+-"}]
    mixed = rlvr_env.make_task("Arithmetic", digits=2, kinds=kinds)
    shapes = []
    for index in range(60):
        problem = mixed.problem(index, 7)
        assert problem == mixed.problem(index, 7)  # seeded per index
        tokens = problem.metadata["expression"].split()
        operands, operators = tokens[::2], set(tokens[1::2])
        assert all(len(n) == 2 for n in operands) and problem.metadata["terms"] == len(operands)
        assert eval(problem.metadata["expression"]) == int(problem.answer)
        shapes.append("3-term" if len(operands) == 3 else ("+" if operators == {"+"} else "-*"))
        assert len(operands) == 2 or operators <= {"+", "-"}
    assert {shape: shapes.count(shape) > 10 for shape in ("+", "-*", "3-term")} == {"+": True, "-*": True, "3-term": True}
    # no kinds, no extra draw: the problems a config made before the option existed
    plain = rlvr_env.make_task("Arithmetic", digits=2)
    assert [plain.problem(i, 0).metadata["expression"] for i in range(3)] == ["86 + 67", "56 + 90", "98 + 17"]


@pytest.mark.parametrize(("expression", "worked"), [
    ("23 + 45", "23 + 45 = 23 + 40 + 5 = 63 + 5 = 68"),
    ("87 - 23", "87 - 23 = 87 - 20 - 3 = 67 - 3 = 64"),
    ("31 - 43", "31 - 43 = -(43 - 31) = -(43 - 30 - 1) = -(13 - 1) = -12"),
    ("6 - 30", "6 - 30 = -(30 - 6) = -24"),
    ("95 * 87", "95 * 87 = 90 * 80 + 90 * 7 + 5 * 80 + 5 * 7 = 7200 + 630 + 400 + 35 = 7830 + 400 + 35 = 8230 + 35 = 8265"),
    ("7 * 86", "7 * 86 = 7 * 80 + 7 * 6 = 560 + 42 = 602"),
    ("0 * 55", "0 * 55 = 0"),
    ("12 - 87 + 45", "12 - 87 = -(87 - 12) = -(87 - 10 - 2) = -(77 - 2) = -75. "
                     "-75 + 45 = -(75 - 45) = -(75 - 40 - 5) = -(35 - 5) = -30"),
    ("50 - 87 + 95", "50 - 87 = -(87 - 50) = -37. -37 + 95 = 95 - 37 = 95 - 30 - 7 = 65 - 7 = 58"),
    ("12 - 87 - 45", "12 - 87 = -(87 - 12) = -(87 - 10 - 2) = -(77 - 2) = -75. -75 - 45 = -(75 + 45) = "
                     "-(75 + 40 + 5) = -(115 + 5) = -120"),
    ("3 + 4 * 5", "4 * 5 = 20. 3 + 20 = 23"),  # products first
    ("84 / 4 - 30", "84 / 4 = 21. 21 - 30 = -(30 - 21) = -(30 - 20 - 1) = -(10 - 1) = -9"),
])
def test_a_worked_solution_takes_one_place_at_a_time(expression, worked):
    assert worked_solution(expression) == (worked, eval(expression.replace("/", "//")))


def test_every_equation_of_a_worked_gold_completion_holds():
    """Each sentence of a worked demonstration is a chain of equal expressions, and it ends with the boxed answer."""
    task = rlvr_env.make_task("Arithmetic", digits=2, worked_solutions=True,
                              kinds=[{"operators": "+-*"}, {"terms": 3, "operators": "+-"}, {"terms": 4, "operators": "+-*/"}])
    for index in range(300):
        problem = task.problem(index, 5)
        working, answer_sentence = task.gold_completion(problem).rsplit(", so ", 1)
        assert answer_sentence == f"the answer is \\boxed{{{problem.answer}}}."
        for sentence in working.split(". "):
            assert len({eval(side.replace("/", "//")) for side in sentence.split(" = ")}) == 1, sentence
    plain = rlvr_env.make_task("Arithmetic")  # off by default: the one-line gold the demo's examples imitate
    assert plain.gold_completion(plain.problem(0, 0)) == "86 + 67 = 153, so the answer is \\boxed{153}."


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"worked_solutions": "yes"}, "worked_solutions"),
        ({"kinds": {"terms": 3}}, "kinds"),
        ({"kinds": [{"terms": 3}, {"digit": 2}]}, "kinds\\[1\\]"),
        ({"kinds": [{"terms": 11}]}, "kinds\\[0\\].terms"),
        ({"kinds": [{"operators": "%"}]}, "kinds\\[0\\].operators"),
        ({"kinds": [{"digits": True}]}, "kinds\\[0\\].digits"),
        ({"digits": 0}, "digits"),
        ({"terms": 1}, "terms"),
        ({"operators": "+%"}, "operators"),
        ({"prompt_template": "no slot"}, "prompt_template"),
        ({"prompt_template": "{expression} {other}"}, "prompt_template"),
        ({"correct_weight": 0}, "correct_weight"),
        ({"format_weight": -1}, "format_weight"),
        ({"few_shot": [["only one"]]}, "few_shot"),
        ({"nonsense": 1}, "nonsense"),
    ],
)
def test_arithmetic_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        rlvr_env.make_task("Arithmetic", **kwargs)


def test_configure_validates_and_reports_change():
    task = rlvr_env.make_task("Arithmetic")
    assert task.configure(digits=3) is True and task.config.digits == 3
    assert task.configure(digits=3) is False
    with pytest.raises(ValueError, match="terms"):
        task.configure(terms=0)


def test_countdown_checks_numbers_and_value():
    task = rlvr_env.make_task("Countdown", num_numbers=3)
    problem = task.problem(0, 0)
    answer = {"target": 24, "numbers": [3, 8, 1]}
    verify = task.verifier
    assert verify("\\boxed{3 * 8 * 1}", answer=answer).score == 1.0
    assert verify("<answer>(3 * 8) / 1 = 24</answer>", answer=answer).score == 1.0
    assert verify("\\boxed{3 * 8}", answer=answer).score == 0.0  # 1 unused
    assert verify("\\boxed{3 * 8 * 1 * 1}", answer=answer).score == 0.0  # 1 used twice
    assert verify("\\boxed{24}", answer=answer).score == 0.0
    assert verify("\\boxed{3 + 8 + 1}", answer=answer).score == 0.0
    assert verify("Let me think.\nI am not sure.", answer=answer).status == "no_answer"
    not_arithmetic = verify("\\boxed{import os}", answer=answer)
    assert (not_arithmetic.score, not_arithmetic.status) == (0.0, "ok")
    assert task.problem(0, 0) == problem
    lenient = rlvr_env.make_task("Countdown", use_all_numbers=False).verifier
    assert lenient("\\boxed{3 * 8}", answer=answer).score == 1.0


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('true')", "2 ** 100", "3 if 1 else 2", "[1, 2]", "1 / 0", "(" * 150 + "1" + ")" * 150, "1" * 300],
)
def test_countdown_parser_rejects_everything_but_arithmetic(expression):
    with pytest.raises(ExpressionError):
        evaluate_expression(expression)


def test_countdown_parser_is_exact():
    value, numbers = evaluate_expression("(7 - 1 / 3) * 3")
    assert value == 20 and numbers == [7, 1, 3, 3]


def test_gsm8k_reads_final_answers_and_grades_last_number():
    task = rlvr_env.make_task("GSM8K", data_path=str(GSM8K))
    assert len(task) == 3 and [task.problem(i, 0).answer for i in range(3)] == ["72", "10", "5000"]
    assert task.problem(0, 0).prompt.startswith("Natalia sold clips")
    assert task.verifier("so she made 5,000 widgets", answer=task.problem(2, 0).answer).score == 1.0
    assert task.verifier("\\boxed{2500 + 2500}", answer=task.problem(2, 0).answer).score == 0.0  # a sum, not the number
    with pytest.raises(IndexError, match="out of range"):
        task.problem(3, 0)


def test_gsm8k_path_from_environment_variable(monkeypatch):
    monkeypatch.setenv("RLVR_GSM8K_PATH", str(GSM8K))
    assert rlvr_env.make_task("GSM8K").size == 3
    monkeypatch.delenv("RLVR_GSM8K_PATH")
    with pytest.raises(DataFileError, match="RLVR_GSM8K_PATH"):
        rlvr_env.make_task("GSM8K")


def test_math_filters_and_answers():
    task = rlvr_env.make_task("MATH", data_path=str(MATH))
    assert [task.problem(i, 0).answer for i in range(len(task))] == ["\\frac{3}{4}", "4", "2, 3", "5\\sqrt{2}", "10"]
    assert task.verifier("so it is \\boxed{0.75}", answer=task.problem(0, 0).answer).score == 1.0
    # MATH answers may be expressions
    assert task.verifier("so it is \\boxed{\\frac{6}{8}}", answer=task.problem(0, 0).answer).score == 1.0
    algebra = rlvr_env.make_task("MATH", data_path=str(MATH), types=["Algebra"])
    assert [p.metadata["line"] for p in (algebra.problem(i, 0) for i in range(len(algebra)))] == [2, 3]
    easy = rlvr_env.make_task("MATH", data_path=str(MATH), levels=[1, 2])
    assert len(easy) == 2 and easy.problem(1, 0).metadata["level"] == 2
    assert easy.configure(levels=[4]) and len(easy) == 1  # reloads with the new filter
    with pytest.raises(DataFileError, match="no problems left"):
        rlvr_env.make_task("MATH", data_path=str(MATH), levels=[5])
    with pytest.raises(ValueError, match="levels"):
        rlvr_env.make_task("MATH", data_path=str(MATH), levels=[6])


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    "task, lines, message",
    [
        ("GSM8K", ['{"question": "q", "answer": "#### 1"}', "{not json"], r"bad\.jsonl:2: invalid JSON"),
        ("GSM8K", ['{"question": "q"}'], r"bad\.jsonl:1: missing field 'answer'"),
        ("GSM8K", ['{"question": "q", "answer": "just 4"}'], r"bad\.jsonl:1: field 'answer' has no final '####"),
        ("GSM8K", ['{"question": "", "answer": "#### 4"}'], r"bad\.jsonl:1: field 'question' must be a non-empty string"),
        ("GSM8K", ["[1, 2]"], r"bad\.jsonl:1: expected a JSON object"),
        ("GSM8K", [""], r"bad\.jsonl: no records"),
        ("MATH", ['{"problem": "p", "solution": "no box"}'], r"bad\.jsonl:1: field 'solution' has no final \\boxed"),
        ("MATH", ['{"problem": "p", "solution": "\\\\boxed{1}"}', '{"solution": "s"}'], r"bad\.jsonl:2: missing field 'problem'"),
        ("MATH", ['{"problem": "p", "answer": null}'], r"bad\.jsonl:1: missing field 'solution'"),
    ],
)
def test_data_file_errors_name_path_line_and_field(tmp_path, task, lines, message):
    with pytest.raises(DataFileError, match=message):
        rlvr_env.make_task(task, data_path=write(tmp_path, "bad.jsonl", lines))


def test_missing_data_file_names_the_path(tmp_path):
    with pytest.raises(DataFileError, match="nowhere.jsonl.*does not exist"):
        rlvr_env.make_task("MATH", data_path=str(tmp_path / "nowhere.jsonl"))


def test_parquet_files_written_by_datasets_load(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    task = rlvr_env.make_task("GSM8K", data_path=str(path))
    assert [task.problem(i, 0).answer for i in range(len(task))] == ["72", "10", "5000"]
    shutil.copy(path, tmp_path / "copy.parquet")  # row numbers stand in for line numbers
    broken = tmp_path / "broken.parquet"
    datasets.Dataset.from_list([{"question": "q", "answer": "no marker"}]).to_parquet(str(broken))
    with pytest.raises(DataFileError, match=r"broken\.parquet:1: field 'answer'"):
        rlvr_env.make_task("GSM8K", data_path=str(broken))


def test_reasoning_gym_adapter_scores_with_its_own_score_answer():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    ids = rlvr_env.register_reasoning_gym()
    assert "rlvr/rg.leg_counting-v0" in ids and all(":" not in i for i in ids)
    for name in ("leg_counting", "basic_arithmetic", "spell_backward", "number_sorting"):
        task = rlvr_env.make_task(f"rg.{name}")
        own = reasoning_gym.create_dataset(name, seed=5)
        for index in range(5):
            problem = task.problem(index, seed=5)
            assert problem.answer == own[index]
            own_score = own.score_answer(own[index]["answer"], own[index])
            assert task.verifier(task.gold_completion(problem), answer=problem.answer).score == own_score == 1.0
            assert task.verifier("Thinking...\nno tags here", answer=problem.answer).status == "no_answer"
    with pytest.raises(ValueError, match="dataset_config"):
        rlvr_env.make_task("rg.leg_counting", dataset_config={"no_such_option": 3})
