"""What a rollout reports each step: rewards, accuracy, lengths and truncation over every rank's rows."""

from __future__ import annotations

import torch

from algos.system.distributed import gather_objects


def policy_token_mask(result) -> torch.Tensor:
    """[B, T] 1 on the response tokens the policy sampled: a multi-turn rollout's policy_mask (tool outputs and env
    messages 0), every response token of a single-turn one."""
    mask = getattr(result, "policy_mask", None)  # a backend may return the env's RolloutResult, which has none
    return result.response_mask if mask is None else mask


def rollout_metrics(result, scores: torch.Tensor) -> dict[str, float]:
    """The per-step rollout metrics (docs/agents.md lists them) from one RolloutResult and its (shaped) [B] scores,
    over the rows of every rank (each rank calls it with its own). Lengths count the policy's tokens
    (policy_token_mask): a multi-turn episode's tool outputs and env messages are not the completion's."""
    columns = {"scores": scores, "solved": result.solved, "lengths": policy_token_mask(result).sum(-1),
               "truncated": result.truncated, **{f"reward/{k}": v for k, v in result.reward_components.items()}}
    local = ({key: values.detach().float().cpu() for key, values in columns.items()}, result.statuses)
    ranks = gather_objects(local)
    rows = {key: torch.cat([part[key] for part, _ in ranks]) for key in columns}
    scores, lengths = rows["scores"], rows["lengths"]
    metrics = {
        "reward_mean": scores.mean().item(),
        "reward_std": scores.std().item() if scores.numel() > 1 else 0.0,
        "accuracy": rows["solved"].mean().item(),  # rlvr_env.task.solved: partial credit is not solved
        "completion_len_mean": lengths.mean().item(),
        "completion_len_max": lengths.max().item(),
        "truncation_rate": rows["truncated"].mean().item(),
    }
    for name in result.reward_components:
        metrics[f"reward/{name}"] = rows[f"reward/{name}"].mean().item()
    statuses = [status for _, part in ranks for status in part]
    for status in ("no_answer", "timeout", "error"):
        metrics[f"status/{status}"] = sum(s == status for s in statuses) / max(1, len(statuses))
    return metrics
