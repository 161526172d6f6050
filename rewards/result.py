"""The verifier contract shared by every reward in this package.

A verifier is a callable ``(completion: str, *, answer, **info) -> VerifyResult``.
It never raises on model output and reports "could not check" as a status, so a
training loop can tell a wrong answer from a timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

OK = "ok"
NO_ANSWER = "no_answer"
TIMEOUT = "timeout"
ERROR = "error"
STATUSES = (OK, NO_ANSWER, TIMEOUT, ERROR)


@dataclass(frozen=True)
class VerifyResult:
    """Score of one completion: ``score`` in the verifier's range, ``status`` one of STATUSES."""

    score: float
    status: str = OK
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"VerifyResult.status must be one of {STATUSES}, got {self.status!r}")

    def __float__(self) -> float:
        return float(self.score)


def error_reason(result: VerifyResult) -> str | None:
    """Why ``result`` could not be scored as asked: its own ``reason``, else its first component's (WeightedSum)."""
    reason = result.details.get("reason")
    return reason if reason is not None else next(iter(result.details.get("reasons", {}).values()), None)


class VerifierErrorWarning(UserWarning):
    """Every completion of a batch scored status "error": a verifier that cannot run (its reason is in the message)."""


@runtime_checkable
class Verifier(Protocol):
    def __call__(self, completion: str, *, answer: Any, **info: Any) -> VerifyResult: ...
