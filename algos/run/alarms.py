"""Health alarms: the failure modes of RL on language models, read off each step's metrics.

Each alarm is one check over the metrics history (algos.run.loop.run_training feeds it every step's record). When one
fires, the run prints one line beside its progress bar, logs `alarm/<name> = 1` in metrics.jsonl, and with
`run.stop_on_alarm` saves a checkpoint and stops. A threshold of 0 turns its alarm off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from algos.config import AlarmConfig


@dataclass(frozen=True)
class Alarm:
    name: str  # metrics.jsonl key: alarm/<name>
    message: str  # the one line a user reads


class HealthMonitor:
    """Feeds on one metrics record per step (``check``) and returns the alarms that step raises."""

    def __init__(self, config: AlarmConfig) -> None:
        self.config = config
        self.history: list[dict[str, Any]] = []
        self.first_entropy: float | None = None
        self.best_eval: float | None = None

    def check(self, step: int, metrics: dict[str, Any]) -> list[Alarm]:
        cfg, alarms = self.config, []
        earlier = self.history[-cfg.window :]
        reward_gain = self._gain("reward_mean", earlier, metrics)
        entropy = _number(metrics.get("entropy"))
        if entropy is not None:
            self.first_entropy = entropy if self.first_entropy is None else self.first_entropy
            stalled = reward_gain is not None and reward_gain < cfg.reward_stall
            if cfg.entropy_collapse and self.first_entropy > 0 and entropy < cfg.entropy_collapse * self.first_entropy \
                    and stalled:
                alarms.append(Alarm("entropy_collapse", f"step {step}: entropy {entropy:.3g} is below "
                                    f"{cfg.entropy_collapse:g} x its start ({self.first_entropy:.3g}) and reward_mean "
                                    f"gained {reward_gain:.3g} over {len(earlier)} steps (alarms.entropy_collapse)"))
        zero_std = _number(metrics.get("zero_std_group_frac"))
        if cfg.zero_std_groups and zero_std is not None and zero_std >= cfg.zero_std_groups:
            alarms.append(Alarm("zero_std_groups", f"step {step}: {zero_std:.0%} of groups have all-equal rewards, no "
                                f"learning signal (alarms.zero_std_groups = {cfg.zero_std_groups:g}): raise "
                                "rollout.group_size, sample at a temperature, or use grpo.dynamic_sampling"))
        clip = _clip_fraction(metrics)
        previous = [c for c in (_clip_fraction(record) for record in earlier) if c is not None]
        if cfg.clip_spike and clip is not None and previous:
            usual = sum(previous) / len(previous)
            if clip > 0.05 and clip > cfg.clip_spike * usual:
                alarms.append(Alarm("clip_spike", f"step {step}: clip fraction {clip:.3g} is over {cfg.clip_spike:g} x "
                                    f"its recent mean {usual:.3g} (alarms.clip_spike): lower optim.lr or "
                                    "grpo.num_iterations"))
        truncated = _number(metrics.get("truncation_rate"))
        if cfg.truncation and truncated is not None and truncated >= cfg.truncation:
            alarms.append(Alarm("truncation", f"step {step}: {truncated:.0%} of completions reach env.max_new_tokens "
                                f"(alarms.truncation = {cfg.truncation:g}): raise env.max_new_tokens or penalise length "
                                "(grpo.soft_overlong)"))
        errors = _number(metrics.get("status/error"))
        if cfg.verifier_errors and errors is not None and errors >= cfg.verifier_errors:
            alarms.append(Alarm("verifier_errors", f"step {step}: {errors:.0%} of completions scored status 'error', "
                                f"not wrong but unscored (alarms.verifier_errors = {cfg.verifier_errors:g}): the verifier "
                                "cannot run; its reason is in the VerifierErrorWarning, or `rlvr score --output`'s details"))
        waited, step_time = _number(metrics.get("async/learner_wait_s")), _number(metrics.get("step_time_s"))
        drawn_ahead = (_number(metrics.get("async/staleness")) or 0) >= 1
        if cfg.rollout_wait and drawn_ahead and waited is not None and step_time and waited > cfg.rollout_wait * step_time:
            alarms.append(Alarm("rollout_wait", f"step {step}: the learner waited {waited:.3g} s of the step's "
                                f"{step_time:.3g} s for its batch (alarms.rollout_wait = {cfg.rollout_wait:g}): the "
                                "rollouts are the bottleneck; raise rollout.max_staleness, or sample fewer or shorter rows"))
        accuracy = _number(metrics.get("eval_accuracy"))
        if accuracy is not None:
            if cfg.eval_drop and self.best_eval is not None and accuracy < self.best_eval - cfg.eval_drop \
                    and reward_gain is not None and reward_gain > cfg.reward_stall:
                alarms.append(Alarm("reward_hacking", f"step {step}: reward_mean rose {reward_gain:.3g} over "
                                    f"{len(earlier)} steps while held-out accuracy fell to {accuracy:.3g} from "
                                    f"{self.best_eval:.3g} (alarms.eval_drop): the reward is being gamed"))
            self.best_eval = accuracy if self.best_eval is None else max(self.best_eval, accuracy)
        self.history.append(metrics)
        return alarms

    @staticmethod
    def _gain(key: str, earlier: list[dict[str, Any]], metrics: dict[str, Any]) -> float | None:
        """How much ``key`` rose from the oldest record of the window to this one (None without both)."""
        now = _number(metrics.get(key))
        then = next((value for value in (_number(r.get(key)) for r in earlier) if value is not None), None)
        return None if now is None or then is None else now - then


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _clip_fraction(metrics: dict[str, Any]) -> float | None:
    low, high = _number(metrics.get("clip_frac_low")), _number(metrics.get("clip_frac_high"))
    return None if low is None and high is None else (low or 0.0) + (high or 0.0)
