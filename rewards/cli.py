"""`rlvr verify` (one prediction against one gold answer) and `rlvr score` (a JSONL file of completions)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    verify = subparsers.add_parser("verify", help="check one predicted answer or response against a gold answer")
    verify.add_argument("--pred", required=True, help="predicted answer or whole model response")
    verify.add_argument("--gold", required=True, help="gold answer (bare LaTeX or plain text)")
    verify.add_argument("--timeout", type=float, default=None, help="hard limit in seconds for the symbolic check")
    verify.set_defaults(func=_verify)

    score = subparsers.add_parser("score", help="score a JSONL file of completions against gold answers")
    score.add_argument("path", type=Path, help="JSONL file, one object per line")
    score.add_argument("--completion-key", default="completion", help="field holding the completion (default: completion)")
    score.add_argument("--answer-key", default="answer", help="field holding the gold answer (default: answer)")
    score.add_argument("--output", type=Path, default=None, help="write each row with score and status to this JSONL file")
    score.add_argument("--workers", type=int, default=None, help="worker processes (default: automatic)")
    score.add_argument("--timeout", type=float, default=5.0, help="hard limit per completion in seconds (default 5)")
    score.add_argument("--batch-size", type=int, default=256, help="rows scored per batch (progress granularity)")
    score.set_defaults(func=_score)


def _verify(args: argparse.Namespace) -> int:
    from .mathcheck import math_verifier

    result = math_verifier(args.pred, answer=args.gold, timeout=args.timeout)
    print(json.dumps({"equal": result.score == 1.0, "score": result.score, "status": result.status,
                      "details": result.details}, ensure_ascii=False))
    return 0 if result.score == 1.0 else 1


def _read_rows(path: Path, completion_key: str, answer_key: str) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"rlvr score: no such file {path}")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"rlvr score: {path}:{number}: not valid JSON ({exc.msg})")
            if not isinstance(row, dict):
                raise SystemExit(f"rlvr score: {path}:{number}: expected a JSON object")
            for key in (completion_key, answer_key):
                if key not in row:
                    raise SystemExit(f"rlvr score: {path}:{number}: missing field {key!r}")
            if not isinstance(row[completion_key], str):
                raise SystemExit(f"rlvr score: {path}:{number}: field {completion_key!r} must be a string")
            rows.append(row)
    return rows


def _score(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .batch import score_batch

    if args.batch_size <= 0:
        raise SystemExit(f"rlvr score: --batch-size must be > 0, got {args.batch_size}")
    rows = _read_rows(args.path, args.completion_key, args.answer_key)
    results = []
    with tqdm(total=len(rows), desc="scoring", unit="row", file=sys.stderr) as bar:
        for start in range(0, len(rows), args.batch_size):
            chunk = rows[start:start + args.batch_size]
            results += score_batch([r[args.completion_key] for r in chunk], [r[args.answer_key] for r in chunk],
                                   workers=args.workers, timeout=args.timeout)
            bar.update(len(chunk))
    if args.output:
        with args.output.open("w", encoding="utf-8") as out:
            for row, result in zip(rows, results):
                out.write(json.dumps({**row, "score": result.score, "status": result.status}, ensure_ascii=False) + "\n")
    statuses = Counter(r.status for r in results)
    mean = sum(r.score for r in results) / len(results) if results else 0.0
    print(json.dumps({"rows": len(results), "mean_score": round(mean, 4), "statuses": dict(statuses)}))
    return 0
