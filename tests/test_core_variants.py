import pytest

from algos.core import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, ROLLOUT_CORRECTIONS
from algos.core.variants import Registry


def test_a_registered_function_is_returned_unchanged_and_found_by_name():
    registry = Registry("widget")

    def plain():
        return 1

    assert registry.register("plain", plain) is plain
    assert registry["plain"] is plain and registry.names == ("plain",)


def test_an_unknown_name_lists_the_known_ones():
    registry = Registry("widget")
    registry.register("a", lambda: 0)
    registry.register("b", lambda: 0)
    with pytest.raises(ValueError, match=r"unknown widget 'c': choose one of 'a', 'b'"):
        registry["c"]


def test_a_name_registers_once():
    registry = Registry("widget")
    registry.register("a", lambda: 0)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        registry.register("a", lambda: 1)


def test_the_core_registries_hold_every_variant_the_configs_offer():
    assert ADVANTAGE_ESTIMATORS.names == ("grpo", "batch-std", "dr-grpo", "rloo")
    assert POLICY_LOSSES.names == ("ppo-clip", "gspo", "cispo", "gmpo")
    assert LOSS_AGGREGATIONS.names == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    assert KL_ESTIMATORS.names == ("k1", "k2", "k3")
    assert ROLLOUT_CORRECTIONS.names == ("tis", "seq_mask")
