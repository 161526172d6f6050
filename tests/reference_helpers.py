"""What the reference-gradient tests share: the paper-side computations, written in plain torch.

Nothing here calls the project's loss, advantage, KL or log-prob helpers: a test compares what the
trainer accumulates against these, so a change to how a loop combines the core shows up as a
different gradient or metric.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from rlvr_env.testing import build_char_tokenizer, build_tiny_model

# fp32 on CPU: the trainer's KV-cached, padded, chunked log-probs agree with an unpadded full forward to ~1e-6.
GRAD_TOLERANCE = {"rtol": 2e-4, "atol": 2e-6}


# Rows of the embedding table past the tokenizer, as in Qwen2.5's padded table: never sampled, and outside the softmax.
PADDED_ROWS = 3


def save_tiny_model(path) -> str:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    model.resize_token_embeddings(len(tokenizer) + PADDED_ROWS, mean_resizing=False)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@dataclass
class Row:
    """One sampled completion, unpadded: [P] prompt ids, [T] generated ids (stop token included)."""

    prompt: torch.Tensor
    response: torch.Tensor
    score: float
    correct: float
    truncated: bool
    step_rewards: torch.Tensor  # [T]
    step_mask: torch.Tensor  # [T] bool

    @property
    def length(self) -> int:
        return self.response.numel()


def rows_of_round(rollout) -> list[Row]:
    """A recorded ScriptedRollout round -> its rows with the padding taken off."""
    rows = []
    for i in range(rollout.prompt_ids.shape[0]):
        valid = rollout.response_mask[i].bool()
        correct = rollout.reward_components.get("correct", rollout.scores)[i].item()
        rows.append(Row(
            prompt=rollout.prompt_ids[i][rollout.prompt_mask[i].bool()],
            response=rollout.response_ids[i][valid],
            score=rollout.scores[i].item(),
            correct=correct,
            truncated=bool(rollout.truncated[i]),
            step_rewards=rollout.process_rewards[i][valid].float(),
            step_mask=rollout.process_step_mask[i][valid],
        ))
    return rows


def token_logprobs(model, row: Row, temperature: float = 1.0):
    """[T] log pi(token), [T] entropy of one row from one unpadded full forward (logits [P+T, V]) over the tokenizer's
    ids (the table's padded rows are no token)."""
    ids = torch.cat([row.prompt, row.response])[None]
    out = model(input_ids=ids)
    start = row.prompt.numel() - 1
    vocab = model.config.vocab_size - PADDED_ROWS
    logits = out.logits[0, start : start + row.length, :vocab].float() / temperature
    log_probs = torch.log_softmax(logits, -1)
    taken = log_probs.gather(-1, row.response[:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return taken, entropy


def clip_surrogate(ratio, advantage, eps_low, eps_high, dual_clip=None):
    """Per-token loss -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), bounded by -c A for A < 0 with dual clip c."""
    loss = torch.maximum(-ratio * advantage, -ratio.clamp(1 - eps_low, 1 + eps_high) * advantage)
    if dual_clip is not None:
        loss = torch.where(advantage < 0, torch.minimum(loss, -dual_clip * advantage), loss)
    return loss


def model_gradients(model) -> dict[str, torch.Tensor]:
    """The gradients of a model's parameters, by name (parameters without one left out)."""
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def clipped_gradients(grads: dict[str, torch.Tensor], max_norm: float) -> tuple[dict[str, torch.Tensor], float]:
    """(``grads`` scaled as torch's global-norm clipping does (max_norm 0 = off), their norm before)."""
    total = math.sqrt(sum(g.double().pow(2).sum().item() for g in grads.values()))
    scale = min(1.0, max_norm / (total + 1e-6)) if max_norm > 0 else 1.0
    return {name: g * scale for name, g in grads.items()}, total


def lr_factor(step_index: int, warmup: int, schedule: str, total_steps: int) -> float:
    """The LR multiplier of 0-based training step ``step_index``: linear warm-up over ``warmup`` steps, then
    constant, linear or cosine decay to 0 at ``total_steps``."""
    if step_index < warmup:
        return (step_index + 1) / (warmup + 1)
    progress = min(1.0, (step_index - warmup) / max(1, total_steps - warmup))
    return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[schedule]


class OptimizerSpy:
    """Records, at every optimizer step, the gradients it applies, the weights they were computed at and the lr."""

    def __init__(self, optimizer, named_modules: dict[str, torch.nn.Module]):
        names = {id(p): f"{prefix}{name}" for prefix, module in named_modules.items()
                 for name, p in module.named_parameters()}
        self.steps: list[dict] = []

        def record(optimizer, args, kwargs):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self.steps.append({
                "grads": {names[id(p)]: p.grad.detach().clone() for p in params if p.grad is not None},
                "weights": {names[id(p)]: p.detach().clone() for p in params},
                "lr": [group["lr"] for group in optimizer.param_groups],
            })

        optimizer.register_step_pre_hook(record)


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], prefix: str = "") -> torch.nn.Module:
    """A copy of ``model`` holding the recorded ``weights`` (names under ``prefix``)."""
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in copied.named_parameters():
            p.copy_(weights[prefix + name])
    return copied


def assert_gradients_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want), f"parameters with a gradient differ: {sorted(set(got) ^ set(want))}"
    for name in want:
        torch.testing.assert_close(got[name], want[name], **GRAD_TOLERANCE, msg=lambda m, n=name: f"{n}: {m}")
