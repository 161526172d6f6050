import argparse
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


def test_score_names_the_bad_row_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"completion": "x", "answer": "1"}\n{"completion": "y"}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: missing field 'answer'"):
        run(["score", str(path)])
