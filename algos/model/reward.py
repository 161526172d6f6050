"""Learned reward models: a transformers sequence-classification model that scores
(prompt, completion) text, and the Bradley-Terry loss it is fitted with (algos/run/reward_model.py trains it).

The classic RLHF reward source (InstructGPT): PPO can use it in place of, or
as well as, the environment's rule-based verifiers. Any local directory holding
an ``AutoModelForSequenceClassification`` with one label works, including ones
trained with TRL's RewardTrainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from algos.model.loading import context_length
from rlvr_env.data import read_records


@dataclass(frozen=True)
class PreferencePair:
    """One human (or rule) judgement: ``chosen`` is a better completion of ``prompt`` than ``rejected``."""

    prompt: str
    chosen: str
    rejected: str


def load_preference_pairs(path: str | Path) -> list[PreferencePair]:
    """A JSON Lines (or parquet) file of {"prompt", "chosen", "rejected"} string rows, read as every dataset file is
    (rlvr_env.data.read_records: a bad line, byte or an empty file is named); errors name the row and field."""
    pairs = []
    for number, row in read_records(Path(path)):
        for field in ("prompt", "chosen", "rejected"):
            if not isinstance(row.get(field), str):
                problem = "is missing" if field not in row else f"must be a string, got {type(row[field]).__name__}"
                raise ValueError(f"{path}: row {number} field {field!r} {problem}")
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"]))
    return pairs


def bradley_terry_loss(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """Float[B], Float[B], optional Float[B] margin -> Float[] mean -log sigmoid(r_chosen - r_rejected - margin)."""
    difference = chosen_rewards - rejected_rewards
    if margin is not None:
        difference = difference - margin
    return -F.logsigmoid(difference).mean()


class RewardModel:
    """Scores (prompt, completion) pairs with a one-label sequence-classification model.

    With a chat template on the tokenizer the pair is rendered as a user turn and
    an assistant turn, else as ``prompt + completion``. Long inputs are cut from
    the left so the end of the completion (where the answer is) always counts.
    """

    def __init__(self, model, tokenizer, max_length: int = 1024, batch_size: int = 16):
        if getattr(model.config, "num_labels", None) != 1:
            raise ValueError(f"reward model must have num_labels=1, got {getattr(model.config, 'num_labels', None)}")
        if tokenizer.pad_token_id is None:
            raise ValueError("reward model tokenizer needs a pad token (the score is read at the last non-pad token)")
        # Sequence-classification heads find each row's last real token through config.pad_token_id.
        model.config.pad_token_id = tokenizer.pad_token_id
        if max_length < 1 or batch_size < 1:
            raise ValueError(f"max_length and batch_size must be >= 1, got {max_length} and {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        # Never past the model's own context (GPT-2's 1024 learned positions raise IndexError beyond it).
        context = context_length(model)
        self.max_length = min(max_length, context) if context is not None else max_length
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str = "cpu", dtype: torch.dtype | None = None, **kwargs):
        """Load a reward model, or start one from a causal LM directory (a fresh score head is added)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not Path(path).is_dir():
            raise FileNotFoundError(f"reward model path {str(path)!r} is not a local directory")
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype)
        return cls(model.to(device), tokenizer, **kwargs)

    def save_pretrained(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _texts(self, prompts: list[str], completions: list[str]) -> list[str]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if self.tokenizer.chat_template:
            return [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}, {"role": "assistant", "content": c}], tokenize=False
                )
                for p, c in zip(prompts, completions)
            ]
        return [p + c for p, c in zip(prompts, completions)]

    def rewards(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        """Float[B] scalar reward per pair, differentiable (for training); one forward pass."""
        self.tokenizer.truncation_side = "left"
        batch = self.tokenizer(
            self._texts(prompts, completions),
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.max_length,
            add_special_tokens=False,
        ).to(self.device)
        return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.squeeze(-1).float()

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        """Float[B] rewards in eval mode, ``batch_size`` pairs per forward pass."""
        was_training = self.model.training
        self.model.eval()
        scores = [
            self.rewards(prompts[start : start + self.batch_size], completions[start : start + self.batch_size])
            for start in range(0, len(prompts), self.batch_size)
        ]
        self.model.train(was_training)
        return torch.cat(scores) if scores else torch.zeros(0)


def preference_accuracy(reward_model: RewardModel, pairs: list[PreferencePair]) -> float:
    """Share of pairs where the chosen completion scores strictly higher than the rejected one."""
    prompts = [p.prompt for p in pairs]
    chosen = reward_model.score(prompts, [p.chosen for p in pairs])
    rejected = reward_model.score(prompts, [p.rejected for p in pairs])
    return (chosen > rejected).float().mean().item()
