"""Score many completions at once, in order, each under a hard time limit."""

from __future__ import annotations

import io
import math
import os
import pickle
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .mathcheck import CHECK_TIMEOUT_S, DEFAULT_TIMEOUT_S, math_verifier
from .result import ERROR, TIMEOUT, Verifier, VerifyResult
from .sandbox import WORKERS, CheckTimeout, WorkerError

# Below this many items a bounded verifier runs in the caller's process: for a batch of
# 64 short answers the fast path costs microseconds each, less than shipping them to a pool.
POOL_MIN_ITEMS = 256


class _WorkerPickler(pickle.Pickler):
    """Pickles as a worker request does, refusing references into `__main__`.

    A worker runs `python -m rewards.sandbox`, so its `__main__` is not the training script:
    a verifier defined there would pickle here and fail to unpickle in every worker.
    """

    def reducer_override(self, obj: Any) -> Any:
        if getattr(obj, "__module__", None) == "__main__":
            name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
            raise pickle.PicklingError(f"{name} is defined in __main__")
        return NotImplemented


def _check_sendable(verifier: Verifier) -> None:
    """Raise ValueError naming `verifier` if worker processes could not load it (one pickle per batch)."""
    try:
        _WorkerPickler(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(verifier)
    except Exception as exc:  # PicklingError, or whatever an object's __reduce__ raises
        name = getattr(verifier, "__qualname__", None) or type(verifier).__qualname__
        raise ValueError(
            f"score_batch verifier {name!r} cannot be sent to worker processes ({str(exc)[:200]}): define it "
            f"in an importable module (not the script run as __main__), or score in this process with workers=0 "
            f"(a bounded verifier can set in_process_safe = True: batches under {POOL_MIN_ITEMS} then skip the pool)"
        ) from exc


def _score_one(verifier: Verifier, completion: str, answer: Any, info: dict) -> dict:
    """Runs inside a worker process; returns plain data only."""
    result = verifier(completion, answer=answer, **info)
    if not isinstance(result, VerifyResult):
        result = VerifyResult(float(result))
    return {"score": float(result.score), "status": result.status, "details": result.details}


def _in_process(verifier: Verifier, completion: str, answer: Any, info: dict) -> VerifyResult:
    try:
        result = verifier(completion, answer=answer, **info)
    except Exception as exc:  # a verifier bug on one row must not lose the batch
        return VerifyResult(0.0, ERROR, {"reason": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return result if isinstance(result, VerifyResult) else VerifyResult(float(result))


def _in_pool(verifier: Verifier, completion: str, answer: Any, info: dict, timeout: float) -> VerifyResult:
    try:
        reply = WORKERS.call(_score_one, (verifier, completion, answer, info), timeout)
    except CheckTimeout:
        return VerifyResult(0.0, TIMEOUT, {"timeout_s": timeout})
    except WorkerError as exc:
        return VerifyResult(0.0, ERROR, {"reason": str(exc)[:300]})
    return VerifyResult(reply["score"], reply["status"], reply["details"])


def default_workers() -> int:
    """The verifier pool's size: this machine's cores shared by the training processes on it (torchrun's
    LOCAL_WORLD_SIZE: each rank scores its own rows with its own pool), at most 8 and at least 1."""
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min((os.cpu_count() or 1) // processes, 8))


def score_batch(
    completions: Sequence[str],
    answers: Sequence[Any],
    *,
    verifier: Verifier = math_verifier,
    infos: Sequence[dict] | None = None,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[VerifyResult]:
    """One VerifyResult per completion, in input order.

    workers: None = automatic (in-process for bounded verifiers on small batches, else a
    pool of default_workers() persistent worker processes); 0 = always in-process;
    n > 0 = a pool of n workers. `timeout` is the hard limit per item (seconds).
    """
    if len(completions) != len(answers):
        raise ValueError(f"score_batch got {len(completions)} completions but {len(answers)} answers")
    if infos is not None and len(infos) != len(completions):
        raise ValueError(f"score_batch got {len(infos)} infos for {len(completions)} completions")
    if workers is not None and workers < 0:
        raise ValueError(f"score_batch workers must be >= 0 or None, got {workers}")
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        # nan/inf also broke the worker's deadline (select() refuses them) and desynchronised it
        raise ValueError(f"score_batch timeout must be a finite number of seconds > 0, got {timeout}")
    infos = infos if infos is not None else [{}] * len(completions)
    safe = getattr(verifier, "in_process_safe", False)
    if workers == 0 or (workers is None and safe and len(completions) < POOL_MIN_ITEMS):
        token = CHECK_TIMEOUT_S.set(timeout)
        try:
            return [_in_process(verifier, c, a, i) for c, a, i in zip(completions, answers, infos)]
        finally:
            CHECK_TIMEOUT_S.reset(token)
    _check_sendable(verifier)
    size = workers or default_workers()
    # one thread per worker process: each thread waits on its own pipe with its own deadline
    with ThreadPoolExecutor(max_workers=size) as threads:
        return list(threads.map(lambda row: _in_pool(verifier, *row, timeout), zip(completions, answers, infos)))
