import argparse
import codecs
import json

import pytest

from rewards import cli


def run(argv):
    parser = argparse.ArgumentParser(prog="rlvr")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_verify_prints_the_verdict_and_sets_the_exit_code(capsys):
    assert run(["verify", "--pred", "so \\boxed{1\\frac{1}{4}}", "--gold", "5/4"]) == 0
    assert json.loads(capsys.readouterr().out)["equal"] is True
    assert run(["verify", "--pred", "\\boxed{2}", "--gold", "3"]) == 1


@pytest.mark.parametrize("gold", ["", " \t"])
def test_verify_refuses_a_blank_gold_as_a_usage_error(gold, capsys):
    """A blank gold exited 1, "not equal", where `rlvr score` refuses a blank gold answer (exit 2)."""
    assert run(["verify", "--pred", "\\boxed{2}", "--gold", gold]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "rlvr verify: --gold is blank: give the gold answer to check against\n")


def test_score_summarises_a_jsonl_file(tmp_path, capsys):
    rows = [{"completion": "\\boxed{3}", "answer": "3"}, {"completion": "\\boxed{4}", "answer": "3"},
            {"completion": "I am still thinking.\nI will not commit to any value yet.", "answer": "1"}]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out_path = tmp_path / "scored.jsonl"
    assert run(["score", str(path), "--output", str(out_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == {"rows": 3, "mean_score": 0.3333, "statuses": {"ok": 2, "no_answer": 1}}
    assert [json.loads(line)["score"] for line in out_path.read_text().splitlines()] == [1.0, 0.0, 0.0]


def test_score_reads_chat_message_completions_from_a_file_with_a_byte_order_mark(tmp_path, capsys):
    """TRL's conversational completions (the last assistant message is scored) and a BOM were refused."""
    rows = [{"completion": [{"role": "assistant", "content": "so \\boxed{3}"}], "answer": "3"},
            {"completion": [{"role": "assistant", "content": "\\boxed{4}"}, {"role": "user", "content": "sure?"},
                            {"role": "assistant", "content": "\\boxed{5}"}], "answer": "4"},
            {"completion": "\\boxed{1}", "answer": "1"}]
    path, out_path = tmp_path / "chat.jsonl", tmp_path / "scored.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + "".join(json.dumps(r) + "\n" for r in rows).encode())
    assert run(["score", str(path), "--output", str(out_path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"rows": 3, "mean_score": 0.6667, "statuses": {"ok": 3}}
    scored = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [row["completion"] for row in scored] == [row["completion"] for row in rows]  # written back as given
    assert [row["score"] for row in scored] == [1.0, 0.0, 1.0]


def test_score_names_the_bad_row_and_field(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"completion": "x", "answer": "1"}\n{"completion": "y"}\n')
    assert run(["score", str(path)]) == 2
    assert capsys.readouterr().err == f"rlvr score: {path}:2: missing field 'answer'\n"


OK_ROW = b'{"completion": "\\\\boxed{1}", "answer": "1"}\n'


@pytest.mark.parametrize("line, problem", [
    (b'{"completion": "\xff", "answer": "1"}\n', "not valid UTF-8 (byte 0xff at column 17)"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "JSON nested too deeply"),
    (b'{"completion": "x", "answer": 1' + b"0" * 5000 + b"}\n", "cannot read the JSON (Exceeds the limit"),
    (b'{"completion": "\\\\boxed{1}", "answer": null}\n', "field 'answer' must be a string or a number, got null"),
    (b'{"completion": "\\\\boxed{1}", "answer": ["1", "2"]}\n',
     "field 'answer' must be a string or a number, got an array"),
    (b'{"completion": "\\\\boxed{1}", "answer": true}\n', "field 'answer' must be a string or a number, got true"),
    (b'{"completion": "\\\\boxed{1}", "answer": " "}\n', "field 'answer' is blank"),
    (b'{"completion": "\\\\boxed{1}", "answer": NaN}\n', "field 'answer' must be a finite number, got nan"),
    (b'{"completion": "\\\\boxed{1}", "answer": 1e400}\n', "field 'answer' must be a finite number, got inf"),
    (b'{"completion": 5, "answer": "1"}\n', "field 'completion' must be a string or a list of chat messages, got a number"),
    (b'{"completion": [{"role": "assistant", "content": "1"}, "2"], "answer": "1"}\n',
     "field 'completion' item 2 must be a chat message (an object with role and content), got a string"),
    (b'{"completion": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], "answer": "1"}\n',
     "field 'completion' holds no assistant message with text: nothing to score"),
    (codecs.BOM_UTF8 + b'{"completion": "\xff", "answer": "1"}\n', "not valid UTF-8 (byte 0xff at column 17)"),
])
def test_score_reports_a_bad_line_by_file_line_and_field(tmp_path, capsys, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(OK_ROW + line)
    assert run(["score", str(path), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert capsys.readouterr().err.startswith(f"rlvr score: {path}:2: {problem}")
    assert not (tmp_path / "out.jsonl").exists()  # stopped before scoring or writing anything


def test_score_refuses_an_empty_file_and_writes_why_a_row_scored_what_it_did(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    assert run(["score", str(empty)]) == 2  # was "mean_score 0.0", exit 0
    assert capsys.readouterr().err == f"rlvr score: {empty}: no rows (the file is empty or blank): nothing to score\n"
    path, out_path = tmp_path / "c.jsonl", tmp_path / "scored.jsonl"
    path.write_text('{"completion": "so \\\\boxed{4}", "answer": "3"}\n')
    assert run(["score", str(path), "--output", str(out_path)]) == 0
    assert json.loads(out_path.read_text())["details"] == {"pred": "4", "gold": "3", "method": "exact"}


def test_score_keeps_a_lone_surrogate_escaped_in_the_output(tmp_path):
    path, out_path = tmp_path / "s.jsonl", tmp_path / "scored.jsonl"
    path.write_text('{"completion": "\\ud800 so \\\\boxed{1}", "answer": "1", "note": "déjà"}\n')
    assert run(["score", str(path), "--output", str(out_path)]) == 0
    assert out_path.read_text(encoding="utf-8") == (
        '{"completion": "\\ud800 so \\\\boxed{1}", "answer": "1", "note": "d\\u00e9j\\u00e0", "score": 1.0, '
        '"status": "ok", "details": {"pred": "1", "gold": "1", "method": "string"}}\n')


def test_score_checks_the_output_path_before_scoring(tmp_path, capsys, monkeypatch):
    import rewards.batch

    monkeypatch.setattr(rewards.batch, "score_batch", lambda *a, **k: pytest.fail("scored before checking --output"))
    path = tmp_path / "c.jsonl"
    path.write_bytes(OK_ROW)
    out_path = tmp_path / "missing" / "scored.jsonl"
    assert run(["score", str(path), "--output", str(out_path)]) == 2
    assert capsys.readouterr().err == f"rlvr score: cannot write --output {out_path}: No such file or directory\n"


@pytest.mark.parametrize("argv, problem", [
    (["score", "absent.jsonl", "--timeout", "0"], "argument --timeout: must be a finite number of seconds > 0"),
    (["score", "absent.jsonl", "--timeout", "-1"], "argument --timeout: must be a finite number of seconds > 0"),
    (["score", "absent.jsonl", "--timeout", "nan"], "argument --timeout: must be a finite number of seconds > 0"),
    (["score", "absent.jsonl", "--timeout", "inf"], "argument --timeout: must be a finite number of seconds > 0"),
    (["score", "absent.jsonl", "--timeout", "1e11"], "argument --timeout: must be a finite number of seconds > 0"),
    (["score", "absent.jsonl", "--workers", "-1"], "argument --workers: must be >= 0, got -1"),
    (["score", "absent.jsonl", "--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["verify", "--pred", "1", "--gold", "1", "--timeout", "-1"],
     "argument --timeout: must be a finite number of seconds > 0"),
    (["verify", "--pred", "1", "--gold", "1", "--timeout", "inf"],
     "argument --timeout: must be a finite number of seconds > 0"),
])
def test_bad_flags_are_refused_before_any_work(argv, problem, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    assert exit_info.value.code == 2
    assert problem in capsys.readouterr().err


def test_verify_escapes_bytes_from_argv_that_are_not_utf8(capsys):
    assert run(["verify", "--pred", "\udcff", "--gold", "2"]) == 1  # how Python hands over a byte 0xff in argv
    out = capsys.readouterr().out
    assert "\\udcff" in out and out.isascii()


def test_score_with_a_reward_function_of_ones_own_passes_it_the_rows_other_fields(tmp_path, capsys):
    """verl's rows and its compute_score signature (the project's verl adapter, importable in the worker processes):
    a list of accepted answers as the gold, data_source from the row."""
    rows = [{"completion": "\\boxed{four}", "answer": ["4", "four"], "data_source": "mine"},
            {"completion": "\\boxed{5}", "answer": ["4"], "data_source": "mine"}]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert run(["score", str(path), "--verifier", "rewards.adapters:compute_score", "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"rows": 2, "mean_score": 0.5, "statuses": {"ok": 2}}
    assert run(["score", str(path)]) == 2  # the math checker takes text or a number as the gold
    assert "field 'answer' must be a string or a number, got an array" in capsys.readouterr().err
    assert run(["score", str(path), "--verifier", "rewards.adapters:no_such_function"]) == 2
    assert "rlvr score: --verifier: reward function 'rewards.adapters:no_such_function': 'rewards.adapters' has no" \
        in capsys.readouterr().err


def test_score_with_trls_own_reward_function_reads_the_rows_as_grpo_trainer_passes_them(tmp_path, capsys):
    """TRL's accuracy_reward on TRL-shaped rows: chat prompts (so the completions reach it as messages, as in
    GRPOTrainer) and the gold in the --answer-key column, which is the name it reads."""
    prompt = [{"role": "user", "content": "A third?"}]
    rows = [{"prompt": prompt, "completion": [{"role": "assistant", "content": "\\boxed{\\frac{1}{3}}"}], "solution": "1/3"},
            {"prompt": prompt, "completion": [{"role": "assistant", "content": "\\boxed{3}"}], "solution": "1/3"}]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    argv = ["score", str(path), "--verifier", "trl.rewards:accuracy_reward", "--answer-key", "solution"]
    assert run([*argv, "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"rows": 2, "mean_score": 0.5, "statuses": {"ok": 2}}
