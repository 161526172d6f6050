"""algos/learn/rollout_correction.py against hand-computed values: the method "auto" resolves to, the weights and
the sums they add, and the mismatch metrics (GRPO's and PPO's)."""

import math

import pytest
import torch

from algos.learn.rollout_correction import correction_weights, mismatch_metrics, resolved_method


def test_auto_is_tis_only_for_an_engine_with_its_own_weights():
    assert resolved_method("auto", True) == "tis" and resolved_method("auto", False) == "none"
    assert resolved_method("seq_mask", False) == "seq_mask" and resolved_method("none", True) == "none"


def test_weights_and_the_sums_they_add_over_two_micro_batches():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding: weights there must not count (nor divide)
    sums: dict[str, float] = {}
    weights = correction_weights("tis", 1.5, old, rollout, mask, sums)
    # pi_old / pi_rollout = 2.0 (capped at 1.5) and 0.5
    torch.testing.assert_close(weights * mask, torch.tensor([[1.5, 0.5, 0.0]]))
    assert sums["rollout_is_weight"] == pytest.approx(2.0) and sums["rollout_is_truncated"] == 1.0
    assert sums["rollout_logp_abs_diff"] == pytest.approx(2 * math.log(2))
    correction_weights("tis", 1.5, old, rollout, mask, sums)  # a second micro-batch adds to the same sums
    assert sums["rollout_is_weight"] == pytest.approx(4.0) and sums["rollout_is_truncated"] == 2.0
    assert sums["rollout_logp_abs_diff"] == pytest.approx(4 * math.log(2))
    # tis counts truncated tokens and no masked rows: the metrics read the missing count as 0
    assert mismatch_metrics(sums, num_tokens=4.0, num_seqs=2.0)["rollout_is_masked_frac"] == 0.0
    off: dict[str, float] = {}
    assert correction_weights("none", 1.5, old, rollout, mask, off) == 1.0
    assert set(off) == {"rollout_logp_abs_diff", "rollout_kl"}  # measured, not corrected
    assert correction_weights("tis", 1.5, old, rollout, mask, None) is not None  # sums=None measures nothing


def test_mismatch_metrics_are_means_per_token_and_per_sequence():
    sums = {"rollout_logp_abs_diff": 3.0, "rollout_kl": 1.5, "rollout_is_weight": 9.0, "rollout_is_truncated": 2.0,
            "rollout_is_masked": 1.0}
    assert mismatch_metrics(sums, num_tokens=6.0, num_seqs=4.0) == {
        "rollout_logp_abs_diff": 0.5, "rollout_kl": 0.25, "rollout_is_weight_mean": 1.5,
        "rollout_is_truncated_frac": 2.0 / 6.0, "rollout_is_masked_frac": 0.25}
    assert mismatch_metrics({"rollout_logp_abs_diff": 3.0, "rollout_kl": 1.5}, 6.0, 1.0) == {
        "rollout_logp_abs_diff": 0.5, "rollout_kl": 0.25}  # correction off: no weight statistics, absent keys are 0
    assert mismatch_metrics({"rollout_logp_abs_diff": 1.0, "rollout_kl": 0.0, "rollout_is_weight": 1.0,
                             "rollout_is_truncated": 0.0, "rollout_is_masked": 1.0}, 1.0, 0.0)["rollout_is_masked_frac"] == 1.0
    assert mismatch_metrics({}, 1.0, 1.0) == {}  # a backend without log-probs
