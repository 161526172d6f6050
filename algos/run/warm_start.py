"""A supervised warm start before RL (the SFT stage TRL and verl users run first): cross-entropy on a task's
demonstrations, on the policy's own tokens.

A demonstration is a problem's prompt turns (``Task.messages``) followed by ``Task.gold_messages``: the assistant's
messages and, between them, what the environment answers (a MultiTurnTask's tool outputs or replies). Its row holds the
tokens the run's rollout would hold for that episode (algos/rollout/multiturn.py; a single-turn task's prompt and completion
as TokenVectorEnv's): the prompt as the env renders it, each assistant message followed by the EOS the policy stops
with, and between two messages the observation ``observation_text`` cuts from the conversation rendered again. Its
labels are the token ids on the assistant's tokens (EOS included) and IGNORE_INDEX elsewhere, so the loss, as RL's,
covers what the policy writes: never the prompt or a tool's output, which the policy could not write anyway.

``warm_start`` takes warm_start.steps AdamW steps of the token-mean loss on demonstrations of training problems;
run_training runs it on a fresh run, between the evaluation before and RL, then ``save_warm_started`` keeps the policy
it leaves (output_dir/warm_start), the KL reference of the run and of its resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algos.core.padding import left_padded, right_padded
from algos.learn import accumulate_and_step
from algos.model.policy import completion_logprobs
from algos.rollout.multiturn import observation_text
from algos.run.checkpoint import export_model
from algos.run.directory import WARM_START_DIR
from algos.run.setup import RunSetup
from algos.system.distributed import (
    barrier,
    micro_batch_inputs,
    padded_micro_batches,
    sum_over_ranks,
)
from algos.system.memory import fixed_micro_batch_rows
from algos.system.runtime import build_optimizer, grad_scaler
from rlvr_env.multiturn_env import MultiTurnTask, render_conversation, with_tool_instructions
from rlvr_env.prompting import encode_prompts, render_prompt, uses_chat_template
from rlvr_env.token_vector_env import draw_problem_indices

IGNORE_INDEX = -100  # a label no loss counts (torch's cross_entropy ignore_index, transformers' labels)
# Beside run.seed, the stream the warm start draws its problems from: no training round's seed (run.setup.round_seed)
# and no evaluation's (env.eval_seed) is a sequence of three numbers.
DEMONSTRATION_STREAM = 0x5F7

Row = tuple[list[int], list[int]]  # ([L] input ids, [L] labels)
Messages = list[dict[str, str]]


def conversation_row(prompt: Messages, replies: Messages, render: Callable[[Messages], str], tokenizer,
                     chat_rendered: bool) -> Row:
    """``prompt`` then ``replies`` (the first the assistant's) as a rollout holds that episode: ``render(prompt)``
    encoded as its prompt, each assistant reply's tokens and EOS (labelled), and between two of them the text
    ``render`` adds for the replies in between (IGNORE_INDEX)."""
    if not replies or replies[0]["role"] != "assistant":
        raise ValueError(f"a demonstration starts with the assistant's message, got {replies[:1]}")
    messages, eos = [*prompt, *replies], tokenizer.eos_token_id
    turns = [index for index in range(len(prompt), len(messages)) if messages[index]["role"] == "assistant"]
    text = render(prompt)
    ids = encode_prompts([text], tokenizer, chat_rendered)[0]
    labels = [IGNORE_INDEX] * len(ids)
    for turn, next_turn in zip(turns, turns[1:] + [None]):
        message = messages[turn]["content"]
        tokens = [*tokenizer(message, add_special_tokens=False)["input_ids"], eos]
        ids, labels = ids + tokens, labels + tokens
        if next_turn is not None:
            next_text = render(messages[:next_turn])
            between = observation_text(text, message, next_text, tokenizer.decode([eos]))
            observation = tokenizer(between, add_special_tokens=False)["input_ids"]
            ids, labels = ids + observation, labels + [IGNORE_INDEX] * len(observation)
            text = next_text
    return ids, labels


def demonstration_row(task, problem, tokenizer, use_chat_template: bool, chat_template_kwargs=None) -> Row:
    """``conversation_row`` of ``problem``'s demonstration (``task.gold_messages``), rendered as the trainers' rollout
    renders ``task``: a MultiTurnTask's episode as MultiTurnEnv does (its tools; their plain-text instructions when
    the template shows none), a single-turn task's prompt as TokenVectorEnv does."""
    chat = uses_chat_template(tokenizer, use_chat_template)
    if isinstance(task, MultiTurnTask):
        toolbox, template = task.tools, tokenizer if chat else None
        prompt = with_tool_instructions(task.messages(problem), toolbox, template)
        render = partial(render_conversation, tokenizer=template, toolbox=toolbox, chat_template_kwargs=chat_template_kwargs)
    else:
        prompt = task.messages(problem)
        render = partial(render_prompt, tokenizer=tokenizer, use_chat_template=use_chat_template,
                         chat_template_kwargs=chat_template_kwargs)
    return conversation_row(prompt, task.gold_messages(problem), render, tokenizer, chat)


@dataclass
class DemonstrationBatch:
    """Rows laid out as a rollout's, what completion_logprobs scores: [n, P+T] ids and mask, each row's prompt (its
    tokens before the first label) left-padded to P and the rest right-padded; [n, T] 1.0 on the labelled tokens."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    label_mask: torch.Tensor


def collate(rows: list[Row], pad_id: int, device) -> DemonstrationBatch:
    """``rows`` -> one DemonstrationBatch on ``device``."""
    starts = [next(i for i, label in enumerate(labels) if label != IGNORE_INDEX) for _, labels in rows]
    prompt_ids, prompt_mask = left_padded([ids[:start] for (ids, _), start in zip(rows, starts)], pad_id, device)
    rests = [ids[start:] for (ids, _), start in zip(rows, starts)]
    labelled = [[float(label != IGNORE_INDEX) for label in labels[start:]] for (_, labels), start in zip(rows, starts)]
    return DemonstrationBatch(
        input_ids=torch.cat([prompt_ids, right_padded(rests, pad_id, torch.long, device)], 1),
        attention_mask=torch.cat([prompt_mask, right_padded([[1] * len(rest) for rest in rests], 0, torch.long, device)], 1),
        prompt_width=prompt_ids.shape[1],
        label_mask=right_padded(labelled, 0.0, torch.float32, device),
    )


def micro_batch_loss(run: RunSetup, batch: DemonstrationBatch, rows: slice | None, tokens: float) -> torch.Tensor:
    """[] the cross-entropy summed over the labelled tokens of a micro-batch's ``rows``, / ``tokens`` (the step's over
    every rank); ``rows`` None: padded_micro_batches' zero-weight pass."""
    inputs = micro_batch_inputs(batch.input_ids, batch.attention_mask, batch.prompt_width, rows, run.env.pad_id)
    logp, _ = run.forward(completion_logprobs, run.model, *inputs, chunk_size=run.config.loss.logprob_chunk_size,
                          vocab_size=len(run.tokenizer))
    mask = batch.label_mask[rows] if rows is not None else torch.zeros_like(logp)
    return -(logp * mask).sum() / tokens


def supervised_step(run: RunSetup, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                    rows: list[Row]) -> dict[str, float]:
    """One optimizer step of the token-mean cross-entropy over every rank's rows (``rows``: this rank's),
    loss.micro_batch_size rows per forward with exact gradient accumulation; the step's metrics. Every rank calls it."""
    batch = collate(rows, run.env.pad_id, run.device)
    tokens = sum_over_ranks(batch.label_mask.sum().item())[0]
    size = fixed_micro_batch_rows(run.config.loss.micro_batch_size)
    micro = padded_micro_batches([slice(start, start + size) for start in range(0, len(rows), size)])
    step = accumulate_and_step(micro, partial(micro_batch_loss, run, batch, tokens=tokens), forward=run.forward,
                               device_type=run.device.type, modules=run.model, optimizer=optimizer, scaler=scaler,
                               max_grad_norm=run.config.optim.max_grad_norm, world_size=run.world.size)
    return {"warm_start/loss": step.loss, "warm_start/tokens": tokens,
            "warm_start/grad_norm": step.grad_norm, "warm_start/skipped_update": float(not step.applied)}


def demonstration_indices(seed: int, step: int, task_size: int | None, count: int) -> list[int]:
    """The ``count`` problem indices of warm-start step ``step`` of a run seeded ``seed``."""
    return draw_problem_indices(np.random.default_rng([seed, DEMONSTRATION_STREAM, step]), task_size, count)


def warm_start(run: RunSetup) -> Iterator[dict[str, Any]]:
    """warm_start.steps steps on demonstrations of the training task's problems (problem seed run.seed, as RL's),
    warm_start.batch_size a step split across ranks, each step's metrics yielded as it ends. Its own AdamW
    (warm_start.lr, optim's betas, eps, weight decay and max_grad_norm; constant rate) and grad scaler, so RL's
    optimizer and schedule start untouched. Every rank calls it."""
    config, task = run.config, run.env.task
    optimizer = build_optimizer(run.model, dataclasses.replace(config.optim, lr=config.warm_start.lr))
    scaler = grad_scaler(config.model, run.device)
    mine = run.world.span(config.warm_start.batch_size)
    for step in range(1, config.warm_start.steps + 1):
        indices = demonstration_indices(config.run.seed, step, task.size, config.warm_start.batch_size)
        rows = [demonstration_row(task, task.problem(index, run.env.problem_seed), run.tokenizer,
                                  config.env.use_chat_template, config.env.chat_template_kwargs)
                for index in indices[mine.start : mine.stop]]
        yield supervised_step(run, optimizer, scaler, rows)


def save_warm_started(run: RunSetup) -> None:
    """Save the policy to output_dir/warm_start and make it the KL reference (when the run keeps one). Every rank
    calls it."""
    export_model(run.modules, run.model, run.output_dir / WARM_START_DIR, run.tokenizer)
    barrier()  # written by rank 0 before any rank reads it
    if run.ref_model is not None:
        load_warm_started(run.ref_model, run.output_dir)


def load_warm_started(model: torch.nn.Module, output_dir: Path) -> None:
    """Set ``model``'s weights to the warm-started policy saved in ``output_dir``."""
    from transformers import AutoModelForCausalLM

    path = Path(output_dir) / WARM_START_DIR
    if not path.is_dir():
        raise FileNotFoundError(f"{path}, the policy after this run's warm start and its KL reference, is missing")
    model.load_state_dict(AutoModelForCausalLM.from_pretrained(path).state_dict())
