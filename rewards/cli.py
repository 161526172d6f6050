"""`rlvr verify` (one prediction against one gold answer) and `rlvr score` (a JSONL file of completions)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from .jsonl import JsonLinesError, read_json_lines
from .mathcheck import BACKENDS

# A day is already far past any check; the bound keeps a typo (1e12) from reading as "wait forever".
MAX_TIMEOUT_S = 86_400.0


class BadInput(Exception):
    """A problem the user can fix (a file, a line, a field): one line on stderr and exit status 2, as argparse does."""


def _timeout_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0 and <= {MAX_TIMEOUT_S:g}, got {text}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum``, refused naming the flag (algos' `rlvr eval` uses it too)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    verify = subparsers.add_parser("verify", help="check one predicted answer or response against a gold answer")
    verify.add_argument("--pred", required=True, help="predicted answer or whole model response")
    verify.add_argument("--gold", required=True, help="gold answer (bare LaTeX or plain text)")
    verify.add_argument("--timeout", type=_timeout_seconds, default=None,
                        help="hard limit in seconds for the symbolic check")
    verify.add_argument("--backend", choices=BACKENDS, default="native",
                        help="native (default: this project's parser, sympy only where needed) or math-verify "
                             "(Hugging Face's, as TRL/open-r1 score; run under the same hard limit)")
    verify.set_defaults(func=_verify)

    score = subparsers.add_parser(
        "score", help="score a JSONL file of completions against gold answers",
        description="Each line is a JSON object with a completion (a string, or a list of chat messages as TRL passes "
                    "them: the last assistant message is scored) and a gold answer (a non-blank string or a finite "
                    "number). Bad input stops before scoring, naming the file, line and field (exit 2).")
    score.add_argument("path", type=Path, help="JSONL file (UTF-8, with or without a BOM), one object per line")
    score.add_argument("--completion-key", default="completion", help="field holding the completion (default: completion)")
    score.add_argument("--answer-key", default="answer", help="field holding the gold answer (default: answer)")
    score.add_argument("--output", type=Path, default=None, help="write each row with score and status to this JSONL file")
    score.add_argument("--workers", type=int_at_least(0), default=None,
                       help="worker processes; 0 scores in this process (default: automatic)")
    score.add_argument("--timeout", type=_timeout_seconds, default=5.0,
                       help="hard limit per completion in seconds (default 5)")
    score.add_argument("--batch-size", type=int_at_least(1), default=256,
                       help="rows scored per batch (progress granularity)")
    score.add_argument("--backend", choices=BACKENDS, default="native", help="math checker, as rlvr verify's")
    score.add_argument("--verifier", metavar="MODULE:FUNCTION", default=None,
                       help="score with a reward function of your own instead of the math checker: this project's "
                            "function(completion, *, answer, **info) or verl's compute_score (rewards.imported); it "
                            "gets each row's answer as it is and the row's other fields as info")
    score.set_defaults(func=_score)


def _json_text(record: dict) -> str:
    text = json.dumps(record, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the input, bad bytes in argv): keep it escaped
        text = json.dumps(record)
    return text


def _verify(args: argparse.Namespace) -> int:
    from .mathcheck import math_verifier

    if not args.gold.strip():  # would read as "not equal" (exit 1), hiding the missing answer from a script
        print("rlvr verify: --gold is blank: give the gold answer to check against", file=sys.stderr)
        return 2
    try:
        result = math_verifier(args.pred, answer=args.gold, timeout=args.timeout, backend=args.backend)
    except ImportError as exc:
        print(f"rlvr verify: {exc}", file=sys.stderr)
        return 2
    print(_json_text({"equal": result.score == 1.0, "score": result.score, "status": result.status,
                      "details": result.details}))
    return 0 if result.score == 1.0 else 1


def _json_kind(value: object) -> str:
    """How a value read from JSON is named in messages: 'a string', 'an array', 'null', 'true'."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return {str: "a string", int: "a number", float: "a number", list: "an array"}.get(type(value), "an object")


def _completion_problem(completion: object) -> str | None:
    """Why `completion` cannot be scored, or None if it can: a string, or chat messages (TRL's conversational format)."""
    if isinstance(completion, str):
        return None
    if isinstance(completion, list):
        for position, message in enumerate(completion, 1):
            if not isinstance(message, dict):
                return f"item {position} must be a chat message (an object with role and content), got {_json_kind(message)}"
        if not any(message.get("role", "assistant") == "assistant" and message.get("content") for message in completion):
            return "holds no assistant message with text: nothing to score (the last assistant message is scored)"
        return None
    return f"must be a string or a list of chat messages, got {_json_kind(completion)}"


def _answer_problem(answer: object) -> str | None:
    """Why `answer` cannot be a gold answer, or None if it can."""
    if isinstance(answer, str):
        return "is blank" if not answer.strip() else None
    if isinstance(answer, float) and not math.isfinite(answer):  # NaN, Infinity, or 1e400 read as inf
        return f"must be a finite number, got {answer}"
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return None
    return f"must be a string or a number, got {_json_kind(answer)}"


# rlvr score's own words for two of a bad line's problems (rewards/jsonl.py's are rlvr_env's data files')
_SCORE_WORDING = {"encoding": "not valid UTF-8", "json": "not valid JSON"}


def _read_rows(path: Path, completion_key: str, answer_key: str, any_answer: bool = False) -> list[dict]:
    """The file's rows, each checked: a completion to score and a gold answer (any non-null value ``any_answer``)."""
    if not path.is_file():
        raise BadInput(f"no such file {path}")
    rows = []
    try:
        records = read_json_lines(path)
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    try:
        for number, row in records:
            where = f"{path}:{number}"
            for key in (completion_key, answer_key):
                if key not in row:
                    raise BadInput(f"{where}: missing field {key!r}")
            answer = row[answer_key]
            answer_problem = ("is null" if answer is None else None) if any_answer else _answer_problem(answer)
            for key, problem in ((completion_key, _completion_problem(row[completion_key])), (answer_key, answer_problem)):
                if problem:
                    raise BadInput(f"{where}: field {key!r} {problem}")
            rows.append(row)
    except JsonLinesError as exc:
        problem = f"{_SCORE_WORDING[exc.kind]} ({exc.detail})" if exc.kind in _SCORE_WORDING else exc.problem
        raise BadInput(f"{exc.where}: {problem}") from None
    if not rows:
        raise BadInput(f"{path}: no rows (the file is empty or blank): nothing to score")
    return rows


def _score(args: argparse.Namespace) -> int:
    try:
        return _score_file(args)
    except BadInput as exc:
        print(f"rlvr score: {exc}", file=sys.stderr)
        return 2


def _score_file(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .adapters import completion_text, passable_info
    from .batch import score_batch
    from .imported import ImportedVerifier
    from .mathcheck import MathVerifier

    try:
        verifier = (MathVerifier(backend=args.backend) if args.verifier is None
                    else ImportedVerifier(args.verifier, answer_column=args.answer_key))
    except (ImportError, ValueError) as exc:
        raise BadInput(f"--verifier: {exc}" if args.verifier else str(exc)) from None
    rows = _read_rows(args.path, args.completion_key, args.answer_key, any_answer=args.verifier is not None)
    # a function of one's own reads the row's other fields (verl's data_source and extra_info, a task's test cases)
    own = {args.completion_key, args.answer_key}
    if args.output:
        _write_rows(args.output, [])  # a bad --output fails now, not after scoring the whole file
    results = []
    with tqdm(total=len(rows), desc="scoring", unit="row", file=sys.stderr) as bar:
        for start in range(0, len(rows), args.batch_size):
            chunk = rows[start:start + args.batch_size]
            completions = [completion_text(r[args.completion_key]) for r in chunk]
            infos = None if args.verifier is None else [passable_info({k: v for k, v in r.items() if k not in own})
                                                        for r in chunk]
            results += score_batch(completions, [r[args.answer_key] for r in chunk], verifier=verifier, infos=infos,
                                   workers=args.workers, timeout=args.timeout)
            bar.update(len(chunk))
    if args.output:
        _write_rows(args.output, [{**row, "score": result.score, "status": result.status, "details": result.details}
                                  for row, result in zip(rows, results)])
    statuses = Counter(r.status for r in results)
    mean = sum(r.score for r in results) / len(results) if results else 0.0
    print(json.dumps({"rows": len(results), "mean_score": round(mean, 4), "statuses": dict(statuses)}))
    return 0


def _write_rows(path: Path, rows: list[dict]) -> None:
    try:
        with path.open("w", encoding="utf-8") as out:
            out.writelines(_json_text(row) + "\n" for row in rows)
    except OSError as exc:  # a missing directory, no permission, a full disk
        raise BadInput(f"cannot write --output {path}: {exc.strerror or exc}") from None
