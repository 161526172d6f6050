"""Health alarms (algos/run/alarms.py): each fires on the pattern it names and stays quiet otherwise; a run stops on one
with run.stop_on_alarm and resumes from the checkpoint it saved."""

from __future__ import annotations

import pytest

from algos.algorithms.grpo import GRPOConfig, train
from algos.config import AlarmConfig, load_config
from algos.run.alarms import HealthMonitor
from algos.run.reporting import read_metrics
from algos.system.paths import latest_checkpoint


def fired(records: list[dict], **thresholds) -> list[list[str]]:
    """The alarm names each record raises, fed in order."""
    monitor = HealthMonitor(AlarmConfig(**thresholds))
    return [[alarm.name for alarm in monitor.check(step, record)] for step, record in enumerate(records, 1)]


def test_entropy_collapse_needs_both_the_collapse_and_a_stalled_reward():
    collapsing = [{"entropy": 2.0, "reward_mean": 0.3}, {"entropy": 1.0, "reward_mean": 0.3},
                  {"entropy": 0.15, "reward_mean": 0.305}]
    assert fired(collapsing, window=2) == [[], [], ["entropy_collapse"]]
    learning = [{**r, "reward_mean": 0.3 + 0.2 * i} for i, r in enumerate(collapsing)]  # entropy falls as it learns
    assert fired(learning, window=2) == [[], [], []]
    assert fired(collapsing, window=2, entropy_collapse=0) == [[], [], []]  # 0 turns it off


def test_groups_without_signal_truncation_and_clip_spikes():
    assert fired([{"zero_std_group_frac": 0.5}, {"zero_std_group_frac": 0.96}]) == [[], ["zero_std_groups"]]
    assert fired([{"truncation_rate": 0.2}, {"truncation_rate": 0.9}]) == [[], ["truncation"]]
    clips = [{"clip_frac_low": 0.01, "clip_frac_high": 0.01}] * 3 + [{"clip_frac_low": 0.05, "clip_frac_high": 0.12}]
    assert fired(clips) == [[], [], [], ["clip_spike"]]  # 0.17 > 5 x 0.02
    assert fired(clips[:3] + [{"clip_frac_low": 0.04, "clip_frac_high": 0.0}]) == [[], [], [], []]  # under 0.05


def test_a_verifier_that_cannot_run_is_told_from_wrong_answers():
    assert fired([{"status/error": 0.1, "status/no_answer": 1.0}, {"status/error": 0.75}]) == [[], ["verifier_errors"]]
    assert fired([{"status/error": 1.0}], verifier_errors=0) == [[]]  # 0 turns it off
    with pytest.raises(ValueError, match=r"config alarms.verifier_errors: is a fraction: must be <= 1"):
        load_config(GRPOConfig, overrides={"alarms.verifier_errors": "1.5"})


def test_reward_up_while_held_out_accuracy_falls_is_flagged_as_reward_hacking():
    records = [{"reward_mean": 0.2, "eval_accuracy": 0.5}, {"reward_mean": 0.4}, {"reward_mean": 0.6, "eval_accuracy": 0.4}]
    assert fired(records, window=2) == [[], [], ["reward_hacking"]]
    honest = [*records[:2], {"reward_mean": 0.6, "eval_accuracy": 0.55}]
    assert fired(honest, window=2) == [[], [], []]


def test_alarm_thresholds_are_validated_by_name():
    with pytest.raises(ValueError, match=r"config alarms.truncation: is a fraction: must be <= 1"):
        load_config(GRPOConfig, overrides={"alarms.truncation": "2"})
    with pytest.raises(ValueError, match=r"config alarms.window: must be >= 1"):
        load_config(GRPOConfig, overrides={"alarms.window": "0"})


def test_a_run_stops_on_its_alarms_with_a_checkpoint_and_the_alarms_logged(tmp_path, capsys):
    from reference_helpers import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    overrides = {
        "model.path": model, "model.autocast": "null", "env.max_new_tokens": "2", "env.use_chat_template": "false",
        "env.eval_size": "4", "run.steps": "3", "run.output_dir": str(tmp_path / "run"), "run.progress": "false",
        "run.tensorboard": "false", "run.plots": "false", "rollout.prompts_per_step": "2", "rollout.group_size": "2",
        "grpo.beta": "0", "grpo.overlong_cache": "1", "run.stop_on_alarm": "true",
        # a 2-token budget truncates nearly every row, and a random model's groups score alike
        "alarms.truncation": "0.5", "alarms.zero_std_groups": "0.5",
    }
    summary = train(load_config(GRPOConfig, overrides=overrides))
    assert summary["stopped_by_alarm"] == "zero_std_groups, truncation" and "eval_accuracy_after" not in summary
    assert latest_checkpoint(tmp_path / "run").name == "checkpoint-1"
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1]
    assert records[-1]["alarm/truncation"] == records[-1]["alarm/zero_std_groups"] == 1.0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("alarm: ")]
    assert len(said) == 2 and all(line.startswith("alarm: step 1: ") for line in said)
    assert "(alarms.zero_std_groups = 0.5)" in said[0] and "(alarms.truncation = 0.5)" in said[1]


def test_each_alarm_says_what_it_saw_and_the_key_to_turn():
    def message(records, **thresholds):
        monitor, said = HealthMonitor(AlarmConfig(**thresholds)), []
        for step, record in enumerate(records, 1):
            said += [alarm.message for alarm in monitor.check(step, record)]
        return said

    assert message([{"entropy": 2.0, "reward_mean": 0.5}, {"entropy": 0.1, "reward_mean": 0.5}]) == [
        "step 2: entropy 0.1 is below 0.1 x its start (2) and reward_mean gained 0 over 1 steps (alarms.entropy_collapse)"]
    assert message([{"zero_std_group_frac": 0.95}]) == [  # at the threshold: fires
        "step 1: 95% of groups have all-equal rewards, no learning signal (alarms.zero_std_groups = 0.95): raise "
        "rollout.group_size, sample at a temperature, or use grpo.dynamic_sampling"]
    assert message([{"clip_frac_high": 0.0625}, {"clip_frac_low": 0.5}]) == [
        "step 2: clip fraction 0.5 is over 5 x its recent mean 0.0625 (alarms.clip_spike): lower optim.lr or "
        "grpo.num_iterations"]
    assert message([{"truncation_rate": 0.95}]) == [
        "step 1: 95% of completions reach env.max_new_tokens (alarms.truncation = 0.9): raise env.max_new_tokens or "
        "penalise length (grpo.soft_overlong)"]
    assert message([{"reward_mean": 0.25, "eval_accuracy": 0.5}, {"reward_mean": 0.75, "eval_accuracy": 0.25}]) == [
        "step 2: reward_mean rose 0.5 over 1 steps while held-out accuracy fell to 0.25 from 0.5 (alarms.eval_drop): "
        "the reward is being gamed"]
    assert message([{"status/error": 0.5}]) == [  # at the threshold: fires
        "step 1: 50% of completions scored status 'error', not wrong but unscored (alarms.verifier_errors = 0.5): the "
        "verifier cannot run; its reason is in the VerifierErrorWarning, or `rlvr score --output`'s details"]
    assert message([{"async/learner_wait_s": 0.9, "step_time_s": 1.0, "async/staleness": 1.0}]) == [
        "step 1: the learner waited 0.9 s of the step's 1 s for its batch (alarms.rollout_wait = 0.5): the rollouts are "
        "the bottleneck; raise rollout.max_staleness, or sample fewer or shorter rows"]


def test_the_rollout_wait_alarm_skips_a_batch_that_could_not_be_drawn_ahead_and_waits_under_half():
    assert fired([{"async/learner_wait_s": 0.9, "step_time_s": 1.0, "async/staleness": 0.0},  # a run's first step
                  {"async/learner_wait_s": 0.5, "step_time_s": 1.0, "async/staleness": 1.0},  # exactly half: quiet
                  {"async/learner_wait_s": 0.6, "step_time_s": 1.0, "async/staleness": 2.0}]) == [[], [], ["rollout_wait"]]
    assert fired([{"async/learner_wait_s": 0.9, "step_time_s": 1.0, "async/staleness": 1.0}], rollout_wait=0) == [[]]
    assert fired([{"async/learner_wait_s": 0.5, "step_time_s": 2.0, "async/staleness": 1.0}]) == [[]]  # a quarter


def test_alarm_edges_are_strict_where_the_docs_say_below_or_above():
    # entropy exactly 0.1 x its start is not below it; a low start entropy (< 1) collapses too
    assert fired([{"entropy": 2.0, "reward_mean": 0.5}, {"entropy": 0.2, "reward_mean": 0.5}]) == [[], []]
    assert fired([{"entropy": 0.5, "reward_mean": 0.5}, {"entropy": 0.01, "reward_mean": 0.5}]) == [[], ["entropy_collapse"]]
    # a reward gain of exactly reward_stall is not a stall, and not a rise either
    gain = [{"entropy": 2.0, "reward_mean": 0.5, "eval_accuracy": 0.5},
            {"entropy": 0.01, "reward_mean": 0.75, "eval_accuracy": 0.0}]
    assert fired(gain, reward_stall=0.25) == [[], []]
    # clip: exactly 0.05, exactly k x the mean, or above 0.05 but under k x the mean: no spike; one side alone counts
    assert fired([{"clip_frac_low": 0.005}, {"clip_frac_low": 0.05}]) == [[], []]
    assert fired([{"clip_frac_low": 0.0625, "clip_frac_high": 0.0}, {"clip_frac_high": 0.25}], clip_spike=4) == [[], []]
    assert fired([{"clip_frac_high": 0.1}, {"clip_frac_high": 0.2}]) == [[], []]
    assert fired([{"clip_frac_low": 0.0, "clip_frac_high": 0.01}, {"clip_frac_high": 0.3}]) == [[], ["clip_spike"]]
    # held-out accuracy: a fall of exactly eval_drop is not past it; a small dip within it is not hacking; the best is
    # kept, so a partial recovery still below it alarms again
    rising = [{"reward_mean": 0.0, "eval_accuracy": 0.5}, {"reward_mean": 0.5, "eval_accuracy": 0.25}]
    assert fired(rising, eval_drop=0.25) == [[], []]
    assert fired([rising[0], {"reward_mean": 0.5, "eval_accuracy": 0.52}]) == [[], []]
    again = [rising[0], {**rising[1], "eval_accuracy": 0.3}, {"reward_mean": 1.0, "eval_accuracy": 0.35}]
    assert fired(again, window=2) == [[], ["reward_hacking"], ["reward_hacking"]]
