"""DPO on preference pairs, offline from a dataset or online with pairs the task's verifier ranks.

One step takes ``pairs`` (chosen y_w, rejected y_l) of one prompt each, scores each completion's sequence log-prob
(summed over its tokens; averaged for IPO) under the policy and under the frozen reference (the initial policy),
and takes one optimizer step of the mean of dpo.loss_type's loss (algos/core/preference.py) over the step's pairs,
on the shared update engine (algos/learn). No reward model and no value model.

- Offline (``--algo dpo --dataset prefs.jsonl``): TRL's preference format, one JSON object per line with "prompt",
  "chosen" and "rejected", each a string or a list of chat messages ({"role", "content"}); the prompt is rendered as
  the run's env renders prompts (env.use_chat_template), each completion is followed by the stop token. The steps
  walk the rows in a shuffled order, a new one each epoch (a pure function of run.seed and the step, so a resume
  takes the same pairs); the reference's log-probs of a row are computed once and kept.
- Online (``--algo online_dpo``, TRL's OnlineDPOTrainer with the verifier as judge): each step samples
  rollout.group_size completions for each of rollout.prompts_per_step prompts of env.id with the rollout engine (any
  engine; a multi-turn task's whole episodes, its tool outputs masked), scores them with the task's verifier and
  pairs a prompt's better completion with a worse one (dpo.pairing). A prompt whose completions all score alike
  gives no pair (logged: dpo/no_pair_prompt_frac).

Metrics as TRL logs them: rewards/chosen, rewards/rejected (the implicit rewards beta (log pi - log ref)),
rewards/margins, rewards/accuracies, logps/chosen, logps/rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.config import TrainConfig, require
from algos.core.preference import PREFERENCE_LOSSES, USES_MEAN_LOGPROBS, implicit_rewards, preference_margin
from algos.learn import accumulate_and_step
from algos.learn.micro_batches import MicroBatchSizer
from algos.model.policy import completion_logprobs
from algos.rollout import RolloutBackend
from algos.rollout.metrics import policy_token_mask, rollout_metrics
from algos.run import warm_start
from algos.run.loop import run_training, setup_run
from algos.run.reporting import MetricsLogger
from algos.run.rollout_pipeline import rollout_pipeline
from algos.system.distributed import micro_batch_inputs, padded_micro_batches, sum_over_ranks, zero_weight_inputs
from algos.system.memory import fixed_micro_batch_rows
from algos.system.runtime import advance_schedule
from rlvr_env.data import read_records
from rlvr_env.prompting import render_prompt, uses_chat_template

PAIRINGS = ("best_worst", "all")
# Beside run.seed, the stream the offline steps' shuffles come from (distinct from the warm start's and the rounds').
PREFERENCE_STREAM = 0xD90


@dataclass
class DPOSection:
    beta: float = 0.1  # the implicit reward's scale (TRL DPOConfig.beta 0.1; Rafailov et al. use 0.1-0.5)
    loss_type: str = "sigmoid"  # PREFERENCE_LOSSES: "sigmoid" (DPO), "ipo", "hinge" (TRL DPOConfig.loss_type)
    label_smoothing: float = 0.0  # conservative DPO's eps, sigmoid only (no TRL 1.16 counterpart: its sigmoid ignores it)
    # Offline: a JSONL of {"prompt", "chosen", "rejected"} (TRL's preference format); null with dpo.online
    dataset: str | None = None
    pairs_per_step: int = 16  # offline pairs per optimizer step, over all ranks (TRL: 8 per device x accumulation)
    online: bool = False  # pairs sampled from env.id's task and ranked by its verifier (--algo online_dpo)
    # online: "best_worst" pairs a prompt's best-scored completion with its worst (one pair); "all" pairs every
    # completion with every lower-scored one (correct x incorrect), the largest score gaps first
    pairing: str = "best_worst"
    max_pairs_per_prompt: int = 4  # online, "all": at most this many pairs of one prompt

    def validate(self) -> None:
        require(self.beta > 0, "dpo.beta", "must be > 0")
        require(self.loss_type in PREFERENCE_LOSSES, "dpo.loss_type", f"must be one of {PREFERENCE_LOSSES.names}")
        require(0 <= self.label_smoothing < 0.5, "dpo.label_smoothing", "must be in [0, 0.5)")
        require(not self.label_smoothing or self.loss_type == "sigmoid", "dpo.label_smoothing",
                f"smooths the sigmoid loss only; dpo.loss_type is {self.loss_type!r}")
        require(self.online or self.dataset is not None, "dpo.dataset",
                "is needed offline: a JSONL of prompt/chosen/rejected rows (--dataset FILE), or use --algo online_dpo")
        require(not (self.online and self.dataset), "dpo.dataset",
                "is read offline only; online DPO samples its pairs from env.id (unset one of dpo.dataset, dpo.online)")
        require(self.pairs_per_step >= 1, "dpo.pairs_per_step", "must be >= 1")
        require(self.pairing in PAIRINGS, "dpo.pairing", f"must be one of {PAIRINGS}, got {self.pairing!r}")
        require(self.max_pairs_per_prompt >= 1, "dpo.max_pairs_per_prompt", "must be >= 1")


@dataclass
class DPOConfig(TrainConfig):
    """DPO (and, through the `online` preset, online DPO): the shared sections plus `dpo`."""

    dpo: DPOSection = field(default_factory=DPOSection)

    def validate(self) -> None:
        super().validate()
        require(self.dpo.online or self.rollout.max_staleness == 0, "rollout.max_staleness",
                "draws batches ahead, and offline DPO samples none (its pairs are dpo.dataset's): set it to 0, or "
                "dpo.online = true")
        require(not self.dpo.online or self.rollout.group_size >= 2, "rollout.group_size",
                "must be >= 2 for online DPO (a pair compares two completions of a prompt)")


# TRL's DPOConfig learning rate (1e-6) is for 7B models; the presets keep the run's optim section.
PRESETS: dict[str, dict[str, Any]] = {"online": {"dpo": {"online": True}}}


# ------------------------------------------------------------------ data


def _messages(value: Any, role: str, row: int, name: str) -> list[dict[str, str]]:
    """A field of a preference row -> chat messages: a string is one ``role`` message; a list must be messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if (isinstance(value, list) and value
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in value)):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ValueError(f"row {row}: field {name!r} must be a string or a non-empty list of "
                     f"{{\"role\", \"content\"}} messages, got {str(value)[:80]!r}")


def load_preference_pairs(path: str | Path) -> list[tuple[list[dict], list[dict], list[dict]]]:
    """A JSONL (or parquet) of {"prompt", "chosen", "rejected"} rows -> [(prompt messages, chosen messages, rejected
    messages)]; errors name the file, the row (1-based) and the field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config dpo.dataset = {str(path)!r}: no such file")
    pairs = []
    for number, row in read_records(path):  # JSON Lines or parquet; a bad line, byte or an empty file is named
        missing = [name for name in ("prompt", "chosen", "rejected") if name not in row]
        if missing:
            raise ValueError(f"{path}: row {number} has no field {missing[0]!r} (TRL's preference format: prompt, "
                             "chosen, rejected)")
        try:
            prompt = _messages(row["prompt"], "user", number, "prompt")
            chosen, rejected = (_messages(row[name], "assistant", number, name) for name in ("chosen", "rejected"))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        for name, messages in (("chosen", chosen), ("rejected", rejected)):
            if messages[0]["role"] != "assistant":
                raise ValueError(f"{path}: row {number}: field {name!r} must start with the assistant's message, got "
                                 f"role {messages[0]['role']!r}")
        pairs.append((prompt, chosen, rejected))
    return pairs


def offline_pair_indices(seed: int, step: int, num_pairs: int, per_step: int) -> list[int]:
    """The dataset rows of offline step ``step`` (1-based): the run walks the rows in an order shuffled anew each
    epoch, ``per_step`` at a time; a pure function of its arguments (a resume takes the same rows)."""
    start = (step - 1) * per_step
    indices = []
    for position in range(start, start + per_step):
        epoch, offset = divmod(position, num_pairs)
        order = np.random.default_rng([seed, PREFERENCE_STREAM, epoch]).permutation(num_pairs)
        indices.append(int(order[offset]))
    return indices


def verifier_pairs(scores: torch.Tensor, pairing: str, cap: int) -> list[tuple[int, int]]:
    """Float[P, G] scores of each prompt's completions -> [(better row, worse row)] as flat row indices (p * G + g):
    "best_worst" the best with the worst of each prompt whose scores differ (the first of equals), "all" every
    (higher, lower) pair, the largest gaps first, at most ``cap`` per prompt. A prompt whose scores are all equal
    gives none."""
    pairs = []
    group_size = scores.shape[1]
    for prompt, row in enumerate(scores.tolist()):
        base = prompt * group_size
        if max(row) == min(row):
            continue
        if pairing == "best_worst":
            pairs.append((base + row.index(max(row)), base + row.index(min(row))))
            continue
        ranked = sorted(((row[w] - row[lo], w, lo) for w in range(group_size) for lo in range(group_size)
                         if row[w] > row[lo]), key=lambda gap: (-gap[0], gap[1], gap[2]))
        pairs += [(base + w, base + lo) for _, w, lo in ranked[:cap]]
    return pairs


def sequence_logprobs(token_logprobs: torch.Tensor, mask: torch.Tensor, mean: bool) -> torch.Tensor:
    """[n, T] token log-probs, [n, T] mask -> [n] their sum over the masked tokens (``mean``: their mean)."""
    total = (token_logprobs * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if mean else total


def interleaved(chosen: list, rejected: list) -> list:
    """[c0, c1, ...], [r0, r1, ...] -> [c0, r0, c1, r1, ...]: a micro-batch of an even number of rows holds whole pairs."""
    return [row for pair in zip(chosen, rejected) for row in pair]


# ------------------------------------------------------------------ trainer


class DPOTrainer:
    # what each step's line (and the live bar) shows first: the loss and the implicit rewards' margin and accuracy
    headline_metrics = {"loss": "loss", "rewards/margins": "margin", "rewards/accuracies": "pref_acc"}

    def __init__(self, config: DPOConfig, *, resume: bool = False, backend: RolloutBackend | None = None) -> None:
        """``backend``: the rollout backend of online DPO and of evaluation (default: the one config.rollout names)."""
        d = config.dpo
        self.pairs = load_preference_pairs(d.dataset) if not d.online else None  # before any run directory exists
        self.run = setup_run(config, resume=resume, backend=backend, keep_reference=True)
        require(d.online or d.pairs_per_step % self.run.world.size == 0, "dpo.pairs_per_step",
                f"{d.pairs_per_step} pairs do not split across {self.run.world.size} processes (torchrun's world size)")
        config = self.run.config  # resolved: every "auto" as this run takes it
        self.config, self.model, self.tokenizer = config, self.run.model, self.run.tokenizer
        self.env, self.backend, self.scaler = self.run.env, self.run.backend, self.run.scaler
        self.forward = self.run.wrap(policy=self.model)
        self.optimizer, self.scheduler, self.start_step, state = self.run.optimization()
        self.micro_batch_sizer = MicroBatchSizer(config.loss, self.run.device, self.forward)
        # online: each step's pairs drawn ahead under rollout.max_staleness (algos/run/rollout_pipeline.py)
        self.rollouts = rollout_pipeline(self.run, self.online_batch, self.start_step, state.get("rollouts"),
                                         unit=2)  # a pair's two rows stay together
        self._rows: dict[int, tuple[warm_start.Row, warm_start.Row]] = {}  # offline: a dataset row's tokenized pair
        self._reference: dict[int, tuple[float, float]] = {}  # offline: its reference log-probs, computed once

    # ------------------------------------------------------------ pairs

    def _pair_rows(self, index: int) -> tuple[warm_start.Row, warm_start.Row]:
        """Dataset row ``index`` as two rows laid out as a rollout's (warm_start.conversation_row): prompt, then completion."""
        if index not in self._rows:
            prompt, chosen, rejected = self.pairs[index]
            env_cfg = self.config.env
            render = partial(render_prompt, tokenizer=self.tokenizer, use_chat_template=env_cfg.use_chat_template,
                             chat_template_kwargs=env_cfg.chat_template_kwargs)
            chat = uses_chat_template(self.tokenizer, env_cfg.use_chat_template)
            self._rows[index] = tuple(warm_start.conversation_row(prompt, reply, render, self.tokenizer, chat)
                                      for reply in (chosen, rejected))
        return self._rows[index]

    def offline_batch(self, step: int) -> tuple[warm_start.DemonstrationBatch, torch.Tensor, list[int]]:
        """(this rank's pairs of ``step``, interleaved chosen/rejected, their [2n] reference log-probs, their rows)."""
        d = self.config.dpo
        mine = self.run.world.span(d.pairs_per_step)
        indices = offline_pair_indices(self.config.run.seed, step, len(self.pairs), d.pairs_per_step)[mine.start : mine.stop]
        batch = warm_start.collate(interleaved(*zip(*(self._pair_rows(i) for i in indices))), self.env.pad_id, self.run.device)
        missing = [i for i in dict.fromkeys(indices) if i not in self._reference]
        if missing:
            position = {i: indices.index(i) for i in missing}
            rows = [row for i in missing for row in (2 * position[i], 2 * position[i] + 1)]
            sub = warm_start.DemonstrationBatch(batch.input_ids[rows], batch.attention_mask[rows], batch.prompt_width,
                                         batch.label_mask[rows])
            values = self._sequence_logprobs(sub, reference=True).tolist()
            self._reference.update({i: (values[2 * k], values[2 * k + 1]) for k, i in enumerate(missing)})
        reference = torch.tensor([v for i in indices for v in self._reference[i]], device=self.run.device)
        return batch, reference, indices

    def online_batch(self, step: int, policy: torch.nn.Module | None = None,
                     backend: RolloutBackend | None = None) -> tuple[warm_start.DemonstrationBatch | None, dict[str, float]]:
        """Sample (by ``backend`` from ``policy``; None: the run's), score and pair this rank's prompts of ``step`` ->
        (the pairs, interleaved; None: no prompt gave one, the rollout's metrics)."""
        d, r = self.config.dpo, self.config.rollout
        result = self.run.sample(backend or self.backend, step, policy=policy)
        scores = result.scores.float()
        metrics = rollout_metrics(result, scores)
        pairs = verifier_pairs(scores.view(-1, r.group_size).cpu(), d.pairing, d.max_pairs_per_prompt)
        prompts = result.prompt_ids.shape[0] // r.group_size  # this rank's
        without = prompts - len({better // r.group_size for better, _ in pairs})
        pairs_total, without_total, prompts_total = sum_over_ranks(len(pairs), without, prompts)
        metrics.update({"dpo/pairs": pairs_total, "dpo/no_pair_prompt_frac": without_total / max(1.0, prompts_total)})
        if not pairs:
            return None, metrics
        order = torch.tensor(interleaved(*zip(*pairs)), device=scores.device)
        batch = warm_start.DemonstrationBatch(
            input_ids=torch.cat([result.prompt_ids, result.response_ids], 1)[order],
            attention_mask=torch.cat([result.prompt_mask, result.response_mask], 1)[order],
            prompt_width=result.prompt_ids.shape[1],
            label_mask=policy_token_mask(result)[order].float(),
        )
        return batch, metrics

    # ------------------------------------------------------------ update

    def _micro_batch_rows(self, batch: warm_start.DemonstrationBatch | None) -> int:
        """Rows per micro-batch of this update (algos/learn/micro_batches.py, the rule of every algorithm), probed on
        the policy's log-probs, rounded down to whole pairs (at least one). Every rank calls it."""
        def policy_logprobs(rows: torch.Tensor):
            return completion_logprobs(self.model, batch.input_ids[rows], batch.attention_mask[rows], batch.prompt_width,
                                       chunk_size=self.config.loss.logprob_chunk_size, vocab_size=len(self.tokenizer))

        pairs = None if batch is None else (batch.input_ids, batch.attention_mask, batch.prompt_width)
        rows = self.micro_batch_sizer.batch_rows(pairs, policy_logprobs, self.model.parameters())
        return max(2, rows // 2 * 2)

    def _micro_slices(self, num_rows: int, size: int) -> list[slice | None]:
        """Micro-batches of whole pairs, ``size`` rows (even), padded with None to the most any rank has."""
        return padded_micro_batches([slice(i, min(i + size, num_rows)) for i in range(0, num_rows, size)])

    def _token_logprobs(self, batch: warm_start.DemonstrationBatch | None, rows: slice | None, reference: bool = False):
        """[n, T] log-probs of a micro-batch's rows under the policy (through the wrapped module) or the reference."""
        if batch is None:  # a rank without pairs runs only zero-weight passes (rows None)
            inputs = zero_weight_inputs(self.env.pad_id, self.run.device)
        else:
            inputs = micro_batch_inputs(batch.input_ids, batch.attention_mask, batch.prompt_width, rows, self.env.pad_id)
        options = dict(chunk_size=self.config.loss.logprob_chunk_size, vocab_size=len(self.tokenizer))
        if reference:
            return self.run.reference(completion_logprobs, self.run.ref_model, *inputs, **options)[0]
        return self.forward(completion_logprobs, self.model, *inputs, **options)[0]

    @torch.no_grad()
    def _sequence_logprobs(self, batch: warm_start.DemonstrationBatch, reference: bool) -> torch.Tensor:
        """[n] sequence log-probs of every row of ``batch``, loss.micro_batch_size rows at a time (this rank's alone;
        a fixed count, so a resumed run's reference values are computed as the whole run's were)."""
        mean = self.config.dpo.loss_type in USES_MEAN_LOGPROBS
        size = max(2, fixed_micro_batch_rows(self.config.loss.micro_batch_size) // 2 * 2)
        parts = [sequence_logprobs(self._token_logprobs(batch, rows, reference), batch.label_mask[rows], mean)
                 for rows in (slice(i, i + size) for i in range(0, batch.input_ids.shape[0], size))]
        return torch.cat(parts)

    def update(self, batch: warm_start.DemonstrationBatch | None, reference: torch.Tensor | None) -> dict[str, float]:
        """One optimizer step of the mean preference loss over every rank's pairs (``batch``: this rank's, chosen and
        rejected interleaved; None: none), with their [2n] reference log-probs (None: computed here). Every rank
        calls it."""
        d = self.config.dpo
        num_rows = batch.input_ids.shape[0] if batch is not None else 0
        size = self._micro_batch_rows(batch)
        if batch is not None and reference is None:
            reference = self._sequence_logprobs(batch, reference=True)
        total_pairs = sum_over_ranks(num_rows // 2)[0]
        if total_pairs == 0:
            return {"skipped_update": 1.0, "lr": advance_schedule(self.scheduler)[0]}
        sums: dict[str, float] = {}
        loss = partial(self._micro_batch_loss, batch, reference, total_pairs, sums)
        step = accumulate_and_step(self._micro_slices(num_rows, size), loss, forward=self.forward,
                                   device_type=self.run.device.type, modules=self.run.modules, optimizer=self.optimizer,
                                   scaler=self.scaler, max_grad_norm=self.config.optim.max_grad_norm,
                                   world_size=self.run.world.size)
        names = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected"]
        means = dict(zip(names, (total / total_pairs for total in sum_over_ranks(*(sums.get(n, 0.0) for n in names)))))
        means["rewards/margins"] = means["rewards/chosen"] - means["rewards/rejected"]
        return {"loss": step.loss, "grad_norm": step.grad_norm, "skipped_update": float(not step.applied),
                "dpo/beta": d.beta, **means, "micro_batch_rows": float(size), "lr": advance_schedule(self.scheduler)[0]}

    def _micro_batch_loss(self, batch, reference: torch.Tensor, total_pairs: float, sums: dict[str, float],
                          rows: slice | None) -> torch.Tensor:
        """The preference loss of a micro-batch's pairs / every rank's number of pairs (their sum is the step's mean);
        its pairs' statistics added to ``sums``. ``rows`` None: a zero-weight pass."""
        d = self.config.dpo
        logp = self._token_logprobs(batch, rows)
        if rows is None:
            return logp.sum() * 0.0
        sequence = sequence_logprobs(logp, batch.label_mask[rows], mean=d.loss_type in USES_MEAN_LOGPROBS)
        chosen, rejected, ref = sequence[0::2], sequence[1::2], reference[rows]
        margin = preference_margin(chosen, rejected, ref[0::2], ref[1::2])
        losses = PREFERENCE_LOSSES[d.loss_type](margin, d.beta, d.label_smoothing)
        reward_chosen = implicit_rewards(chosen, ref[0::2], d.beta)
        reward_rejected = implicit_rewards(rejected, ref[1::2], d.beta)
        for name, value in (("rewards/chosen", reward_chosen.sum()), ("rewards/rejected", reward_rejected.sum()),
                            ("rewards/accuracies", (reward_chosen > reward_rejected).float().sum()),
                            ("logps/chosen", chosen.detach().sum()), ("logps/rejected", rejected.detach().sum())):
            sums[name] = sums.get(name, 0.0) + value.item()
        return losses.sum() / total_pairs

    # ------------------------------------------------------------ loop

    def save(self, step: int) -> Path:
        return self.run.save(step, self.optimizer, self.scheduler, {"rollouts": self.rollouts.state(step)})

    def train_step(self, step: int, logger: MetricsLogger) -> dict[str, float]:
        if self.config.dpo.online:
            batch, metrics = self.rollouts.batch_for(step)
            metrics.update(self.update(batch, None))  # the reference's log-probs, and the policy's, computed now
            if metrics["skipped_update"] and metrics["dpo/pairs"] == 0:
                logger.write(f"step {step}: every prompt's completions scored alike: no pair, update skipped")
            self.rollouts.weights_after(step)
            return metrics
        batch, reference, _ = self.offline_batch(step)
        return self.update(batch, reference)

    def train(self) -> dict[str, Any]:
        return run_training(self)


def train(config: DPOConfig, *, resume: bool = False) -> dict[str, Any]:
    """Run DPO (offline, or online with dpo.online) as configured; returns eval accuracy before/after and the plot."""
    return DPOTrainer(config, resume=resume).train()


Config = DPOConfig
