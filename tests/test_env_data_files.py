"""GSM8K/MATH data files: malformed files, MATH row shapes and golds, failed reconfigures, parquet reads."""

import json
import os
from pathlib import Path

import gymnasium as gym
import pytest

import rlvr_env
from rlvr_env.data import DataFileError

GSM8K_ROW = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
MATH_TINY = Path(__file__).parent / "data" / "math_tiny.jsonl"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_invalid_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(GSM8K_ROW).encode() + b"\n" + b'{"question": "caf\xe9", "answer": "#### 1"}\n')
    with pytest.raises(DataFileError, match=r"bad\.jsonl:2: not UTF-8 \(byte 0xe9 at column 18\)"):
        rlvr_env.make_task("GSM8K", data_path=str(path))


def test_upper_case_parquet_suffix_is_read_as_parquet(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")

    path = tmp_path / "train.PARQUET"
    parquet.write_table(pyarrow.table({key: [value] for key, value in GSM8K_ROW.items()}), path)
    assert rlvr_env.make_task("GSM8K", data_path=str(path)).problem(0, 0).answer == "4"


def test_corrupt_parquet_names_the_file(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataFileError, match=r"corrupt\.parquet: not a readable parquet file"):
        rlvr_env.make_task("GSM8K", data_path=str(path))


@pytest.mark.parametrize(
    "task, row, template, placeholder",
    [
        ("GSM8K", GSM8K_ROW, "{question} {hint}", "question"),
        ("GSM8K", GSM8K_ROW, "{question} Put it in \\boxed{}.", "question"),
        ("MATH", {"problem": "p", "solution": "\\boxed{3}"}, "{problem} \\boxed{}", "problem"),
    ],
)
def test_bad_prompt_template_is_rejected_naming_the_field(tmp_path, task, row, template, placeholder):
    data_path = write_jsonl(tmp_path / "data.jsonl", [row])
    with pytest.raises(ValueError, match=f"prompt_template must format with only {{{placeholder}}}"):
        rlvr_env.make_task(task, data_path=data_path, prompt_template=template)


def test_math_null_or_empty_answer_falls_back_to_the_solution_box(tmp_path):
    rows = [
        {"problem": "1 + 2?", "solution": "so \\boxed{3}", "answer": None},
        {"problem": "2 + 2?", "solution": "so \\boxed{4}", "answer": " "},
        {"problem": "3 + 3?", "solution": "so \\boxed{5}", "answer": "6"},
    ]
    task = rlvr_env.make_task("MATH", data_path=write_jsonl(tmp_path / "math.jsonl", rows))
    assert [task.problem(i, 0).answer for i in range(3)] == ["3", "4", "6"]


def test_math_null_answer_without_a_boxed_solution_names_line_and_fields(tmp_path):
    rows = [{"problem": "p", "solution": "\\boxed{1}"}, {"problem": "p", "solution": "no box", "answer": None}]
    message = r"math\.jsonl:2: field 'solution' has no final \\boxed\{\.\.\.\} answer and field 'answer' is missing or empty"
    with pytest.raises(DataFileError, match=message):
        rlvr_env.make_task("MATH", data_path=write_jsonl(tmp_path / "math.jsonl", rows))


def test_math_parquet_with_a_partly_null_answer_column(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")

    path = tmp_path / "math.parquet"
    columns = {"problem": ["p1", "p2"], "solution": ["\\boxed{1}", "\\boxed{2}"], "answer": ["7", None]}
    parquet.write_table(pyarrow.table(columns), path)
    task = rlvr_env.make_task("MATH", data_path=str(path))
    assert [task.problem(i, 0).answer for i in range(2)] == ["7", "2"]


def test_math_gold_reads_the_solution_as_a_prediction_is_read(tmp_path):
    solution = "Factoring, $(x-2)(x-3)=0$, so the solutions are $\\boxed{2}$ and $\\boxed{3}$."
    rows = [
        {"problem": "Solve x^2 - 5x + 6 = 0.", "solution": solution},
        {"problem": "p", "solution": "First $\\boxed{1}$. Then, correcting that, $\\boxed{5}$."},  # a revision: the last box
    ]
    task = rlvr_env.make_task("MATH", data_path=write_jsonl(tmp_path / "math.jsonl", rows))
    problem = task.problem(0, 0)
    assert [problem.answer, task.problem(1, 0).answer] == ["2, 3", "5"]
    assert task.verifier(solution, answer=problem.answer).score == 1.0  # a completion in the reference's own style
    assert task.verifier("\\boxed{3, 2}", answer=problem.answer).score == 1.0
    assert task.verifier("\\boxed{3}", answer=problem.answer).score == 0.0  # half the solutions
    assert task.verifier(task.gold_completion(problem), answer=problem.answer).score == 1.0
    # "or" between a reference's boxes lists its answers: only the full list scores, a hedge does not
    either = rlvr_env.make_task("MATH", data_path=write_jsonl(tmp_path / "or.jsonl", [
        {"problem": "Solve x^2 = 9.", "solution": "So $x = \\boxed{3}$ or $x = \\boxed{-3}$."}]))
    roots = either.problem(0, 0)
    assert roots.answer == "3, -3"
    completions = ("\\boxed{-3, 3}", "either \\boxed{3} or \\boxed{-3}", "\\boxed{-3}")
    assert [either.verifier(c, answer=roots.answer).score for c in completions] == [1.0, 0.0, 0.0]


def test_rewritten_parquet_with_the_same_mtime_is_read_again(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")

    path = tmp_path / "train.parquet"
    parquet.write_table(pyarrow.table({"question": ["q1"], "answer": ["#### 1"]}), path)
    assert rlvr_env.make_task("GSM8K", data_path=str(path)).problem(0, 0).answer == "1"
    stat = os.stat(path)
    parquet.write_table(pyarrow.table({"question": ["q2"], "answer": ["#### 2"]}), path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # a cache keyed on path and mtime would serve row "1"
    assert rlvr_env.make_task("GSM8K", data_path=str(path)).problem(0, 0).answer == "2"


def test_math500_shape_matches_level_and_type_filters(tmp_path):
    rows = [  # HuggingFaceH4/MATH-500: integer level, "subject" instead of "type"
        {"problem": "1 + 1?", "solution": "\\boxed{2}", "answer": "2", "subject": "Algebra", "level": 1},
        {"problem": "2 + 2?", "solution": "\\boxed{4}", "answer": "4", "subject": "Prealgebra", "level": 2},
        {"problem": "3 + 3?", "solution": "\\boxed{6}", "answer": "6", "type": "Algebra", "level": "Level 3"},
    ]
    data_path = write_jsonl(tmp_path / "math500.jsonl", rows)
    easy = rlvr_env.make_task("MATH", data_path=data_path, levels=[1, 2])
    assert [easy.problem(i, 0).metadata["level"] for i in range(len(easy))] == [1, 2]
    algebra = rlvr_env.make_task("MATH", data_path=data_path, types=["Algebra"])
    assert [algebra.problem(i, 0).metadata["line"] for i in range(len(algebra))] == [1, 3]


def test_failed_reconfigure_leaves_the_env_usable(tmp_path):
    rows = [{"problem": f"level {level}", "solution": f"\\boxed{{{level}}}", "level": f"Level {level}"} for level in (1, 1, 2)]
    env = gym.make("rlvr/MATH-v0", data_path=write_jsonl(tmp_path / "levels.jsonl", rows))
    env.reset(seed=0)
    with pytest.raises(DataFileError, match=r"levels\.jsonl: no problems left after the filters"):
        env.reset(options={"task": {"levels": [5]}})
    task = env.unwrapped.task
    assert task.config.levels == () and task.size == 3
    prompt, _ = env.reset(options={"task": {"levels": [2]}})
    assert task.config.levels == (2,) and task.size == 1 and "level 2" in prompt


def test_a_data_file_is_read_as_rlvr_score_reads_one(tmp_path):
    """One reader (rewards.jsonl): a byte-order mark is no error, an integer past int()'s limit is named by line."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GSM8K_ROW).encode() + b"\n")
    assert rlvr_env.make_task("GSM8K", data_path=str(path)).problem(0, 0).answer == "4"
    path.write_bytes(json.dumps(GSM8K_ROW).encode() + b'\n{"question": "q", "answer": 1' + b"0" * 5000 + b"}\n")
    with pytest.raises(DataFileError, match=r"bom\.jsonl:2: cannot read the JSON \(Exceeds the limit"):
        rlvr_env.make_task("GSM8K", data_path=str(path))


@pytest.mark.parametrize("solution, answer", [
    ("3 + 4 = 7\n####7", "7"),  # no space after the marker
    ("first #### 1, then\n#### 2", "2"),  # the last marker's number
    ("so 1,234 in all\n#### 1,234", "1234"),
])
def test_gsm8k_reads_the_number_after_the_last_marker(solution, answer):
    from rlvr_env.tasks.gsm8k import final_answer

    assert final_answer(solution) == answer


@pytest.mark.parametrize("flag", ["fallback_last_number", "literal_answer", "boxed_only"])
def test_gsm8k_flags_must_be_booleans(tmp_path, flag):
    with pytest.raises(ValueError, match=f"^{flag} must be true or false, got 'false'$"):
        rlvr_env.make_task("GSM8K", data_path=write_jsonl(tmp_path / "q.jsonl", [GSM8K_ROW]), **{flag: "false"})


def test_problems_carry_their_index_and_file_line(tmp_path):
    gsm8k = rlvr_env.make_task("GSM8K", data_path=write_jsonl(tmp_path / "q.jsonl", [GSM8K_ROW, GSM8K_ROW]))
    assert [gsm8k.problem(i, 0).metadata for i in range(2)] == [{"index": 0, "line": 1}, {"index": 1, "line": 2}]
    algebra = rlvr_env.make_task("MATH", data_path=str(MATH_TINY), types=["Algebra"])
    assert algebra.problem(0, 0).metadata == {"index": 0, "line": 2, "level": 2, "type": "Algebra"}


def test_a_glob_reads_a_splits_shards_in_order_and_names_each_rows_file(tmp_path):
    """A downloaded dataset's layout (data/train-00000-of-00002.parquet, ...): the pattern's files in sorted order, each
    problem's index its place among all of them; a bad row is named by its own shard; a test split beside it stays out."""
    data = tmp_path / "data"
    data.mkdir()
    second = {"question": "What is 3 + 3?", "answer": "#### 6"}
    write_jsonl(data / "train-00001-of-00002.jsonl", [second])
    write_jsonl(data / "train-00000-of-00002.jsonl", [GSM8K_ROW, GSM8K_ROW])
    write_jsonl(data / "test-00000-of-00001.jsonl", [{"question": "held out", "answer": "#### 1"}])
    gsm8k = rlvr_env.make_task("GSM8K", data_path=str(data / "train-*.jsonl"))
    assert len(gsm8k) == 3 and gsm8k.problem(2, 0).answer == "6"
    assert [gsm8k.problem(i, 0).metadata for i in range(3)] == [
        {"index": 0, "file": str(data / "train-00000-of-00002.jsonl"), "line": 1},
        {"index": 1, "file": str(data / "train-00000-of-00002.jsonl"), "line": 2},
        {"index": 2, "file": str(data / "train-00001-of-00002.jsonl"), "line": 1}]
    write_jsonl(data / "train-00001-of-00002.jsonl", [second, {"question": "no answer"}])
    with pytest.raises(DataFileError, match=r"train-00001-of-00002\.jsonl:2: missing field 'answer'"):
        rlvr_env.make_task("GSM8K", data_path=str(data / "train-*.jsonl"))
    with pytest.raises(DataFileError, match=r"GSM8KTask data files '.*valid-\*\.jsonl' \(from data_path\): the pattern "
                                             r"matches no file"):
        rlvr_env.make_task("GSM8K", data_path=str(data / "valid-*.jsonl"))
    with pytest.raises(DataFileError, match=r"is a directory: name its files, e.g. '.*train-\*\.parquet'"):
        rlvr_env.make_task("GSM8K", data_path=str(data))
    rows = rlvr_env.make_task("Dataset", data_path=str(data / "t*-00000-*.jsonl"), prompt_field="question")
    assert [rows.problem(i, 0).prompt for i in range(2)] == ["held out", GSM8K_ROW["question"]]  # sorted: test-, then train-


def test_a_file_task_from_its_config_object_its_bounds_and_what_its_errors_name(tmp_path, monkeypatch):
    from rlvr_env.tasks.competition_math import MATHConfig
    from rlvr_env.tasks.gsm8k import GSM8KConfig

    path = write_jsonl(tmp_path / "q.jsonl", [GSM8K_ROW])
    task = rlvr_env.make_task("GSM8K", config=GSM8KConfig(data_path=path))
    assert len(task) == 1 and task.configure(data_path=path) is False  # unchanged: nothing reloaded
    with pytest.raises(IndexError, match="problem index 1 out of range for 1 problems"):
        task.problem(1, 0)
    monkeypatch.setenv("RLVR_GSM8K_PATH", str(tmp_path / "gone-*.jsonl"))
    with pytest.raises(DataFileError, match=r"\(from RLVR_GSM8K_PATH\): the pattern matches no file"):
        rlvr_env.make_task("GSM8K")
    with pytest.raises(DataFileError, match=f"data file {str(tmp_path)!r} \\(from data_path\\) is a directory"):
        rlvr_env.make_task("GSM8K", data_path=str(tmp_path))
    with pytest.raises(DataFileError, match=r":1: missing field 'answer' \(fields: level, question\)$"):
        rlvr_env.make_task("GSM8K", data_path=write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "level": 1}]))
    parquet = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    parquet.write_table(pyarrow.table({"question": pyarrow.array([], pyarrow.string())}), tmp_path / "empty.parquet")
    with pytest.raises(DataFileError, match=r"empty\.parquet: no records$"):
        rlvr_env.make_task("GSM8K", data_path=str(tmp_path / "empty.parquet"))
    math_rows = [json.loads(line) for line in MATH_TINY.read_text().splitlines() if line.strip()]
    for shard in ("a", "b"):
        write_jsonl(tmp_path / f"math-{shard}.jsonl", math_rows)
    with pytest.raises(DataFileError, match=r"^2 files \(.*math-a\.jsonl, \.\.\.\): no problems left after the filters"):
        rlvr_env.make_task("MATH", config=MATHConfig(data_path=str(tmp_path / "math-*.jsonl"), types=("Nothing",)))


@pytest.mark.parametrize("settings, message", [
    ({"levels": 3}, "levels must be a list of integers in 1..5, got 3"),
    ({"levels": [7]}, r"levels must be a list of integers in 1..5, got \(7,\)"),
    ({"types": "Algebra"}, "types must be a list of strings, got 'Algebra'"),
    ({"types": [1]}, r"types must be a list of strings, got \(1,\)"),
])
def test_math_filters_of_the_wrong_shape_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        rlvr_env.make_task("MATH", data_path=str(MATH_TINY), **settings)


def test_math_curriculum_adds_one_level_at_a_time_and_each_level_loads():
    task = rlvr_env.make_task("MATH", data_path=str(MATH_TINY))
    levels = task.curriculum_levels()
    assert levels == [{"levels": tuple(range(1, top + 1))} for top in range(1, 6)]
    # math_tiny.jsonl holds one problem of each of levels 1-4 and one of no level
    assert [len(rlvr_env.make_task("MATH", data_path=str(MATH_TINY), **level)) for level in levels[:4]] == [1, 2, 3, 4]
