"""Rule-based verifiers for RL with verifiable rewards (no torch import, ever).

    from rewards import math_equal, math_verifier, score_batch
    math_equal("so the total is \\boxed{1\\frac{1}{4}}", "5/4")      # True
    math_verifier("... \\boxed{7}", answer="7")                         # VerifyResult(1.0, "ok", {...})
"""

from . import adapters
from .batch import score_batch
from .code import CodeLimits, CodeVerifier, code_verifier, run_code
from .extract import extract_answer
from .mathcheck import DEFAULT_TIMEOUT_S, MathVerifier, math_equal, math_verifier
from .result import ERROR, NO_ANSWER, OK, STATUSES, TIMEOUT, Verifier, VerifierErrorWarning, VerifyResult, error_reason
from .shaping import FormatReward, WeightedSum, format_reward, overlong_filter_mask, soft_overlong_penalty

__all__ = [
    "DEFAULT_TIMEOUT_S", "ERROR", "NO_ANSWER", "OK", "STATUSES", "TIMEOUT", "CodeLimits", "CodeVerifier",
    "FormatReward", "MathVerifier", "Verifier", "VerifierErrorWarning", "VerifyResult", "WeightedSum", "adapters",
    "code_verifier", "error_reason", "extract_answer", "format_reward", "math_equal", "math_verifier",
    "overlong_filter_mask", "run_code", "score_batch", "soft_overlong_penalty",
]
