"""An update's statistics, summed over its micro-batches and ranks."""

from __future__ import annotations

import math

from algos.system.distributed import gather_objects


class UpdateStats:
    """An update's statistics summed over its micro-batches, each weighted as the caller says (usually by its
    loss tokens), plus the policy ratio's range; ``means`` divides the sums by a token count."""

    SURROGATE_MEANS = ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "ratio_mean")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.ratio_min, self.ratio_max = math.inf, -math.inf

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value * weight

    def add_surrogate(self, stats: dict[str, float], tokens: float) -> None:
        """One micro-batch's PolicyLossOutput.stats over ``tokens`` loss tokens."""
        for key in self.SURROGATE_MEANS:
            self.add(key, stats[key], tokens)
        self.ratio_min, self.ratio_max = min(self.ratio_min, stats["ratio_min"]), max(self.ratio_max, stats["ratio_max"])

    def over_ranks(self) -> UpdateStats:
        """These statistics summed (ratio range: widened) over every rank's; every rank calls it."""
        ranks = gather_objects((self.sums, self.ratio_min, self.ratio_max))  # a rank without rows has no sums
        self.sums = {key: sum(sums.get(key, 0.0) for sums, _, _ in ranks) for key in {k for sums, _, _ in ranks for k in sums}}
        self.ratio_min, self.ratio_max = min(low for _, low, _ in ranks), max(high for _, _, high in ranks)
        return self

    def means(self, tokens: float) -> dict[str, float]:
        """Each sum / ``tokens``, and ratio_min / ratio_max when a surrogate was added."""
        means = {key: value / tokens for key, value in self.sums.items()}
        if self.ratio_min <= self.ratio_max:
            means.update(ratio_min=self.ratio_min, ratio_max=self.ratio_max)
        return means
