"""Turning a task's chat turns into the prompt text a model sees."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from rlvr_env.task import validate_prompt_template


def render_prompt(messages: Sequence[dict[str, str]], tokenizer=None, use_chat_template: bool = True) -> str:
    """Chat turns -> prompt text: through the tokenizer's chat template when it has
    one (ending with the generation prompt), else plain text with turns separated
    by blank lines (what a base model continues)."""
    if tokenizer is not None and use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return "\n\n".join(turn["content"] for turn in messages)


def encode_prompts(texts: Sequence[str], tokenizer, chat_rendered: bool) -> list[list[int]]:
    """Token ids of each prompt. A chat template already writes its special tokens,
    so the tokenizer adds none then; plain text gets the tokenizer's own (e.g. BOS)."""
    return tokenizer(list(texts), add_special_tokens=not chat_rendered)["input_ids"]


def uses_chat_template(tokenizer, use_chat_template: bool) -> bool:
    return tokenizer is not None and use_chat_template and bool(getattr(tokenizer, "chat_template", None))


# The stream of few-shot keep draws: a constant so they never coincide with a task's own problem draws.
_FEW_SHOT_STREAM = 0x5F5E


def validate_chance(value, name: str, meaning: str) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a number in [0, 1] (``meaning``: the chance of what)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1] ({meaning}), got {value!r}")


def validate_few_shot_keep(value) -> None:
    """Raise ValueError naming few_shot_keep unless it is a number in [0, 1]."""
    validate_chance(value, "few_shot_keep", "the chance each few-shot example is shown")


def shown_few_shot(few_shot: Sequence[tuple[str, str]], keep: float, problem) -> list[tuple[str, str]]:
    """The few-shot pairs ``problem``'s prompt shows: each one (in order) when its draw is below ``keep``.

    The draws are a pure function of the problem (its metadata ``index`` and prompt text, never a
    process' hash seed), so a given problem shows the same examples wherever and whenever it is rendered;
    and as ``keep`` falls a problem's shown examples only shrink. ``keep = 1`` shows them all and
    ``keep = 0`` none (zero-shot); in between a prompt shows ``len(few_shot) * keep`` of them on average,
    some prompts all, some none, so a scheduled ``keep`` fades the examples out prompt by prompt."""
    if keep >= 1.0 or not few_shot:
        return list(few_shot)
    if keep <= 0.0:
        return []
    key = [_FEW_SHOT_STREAM, int(problem.metadata.get("index", 0)), zlib.crc32(problem.prompt.encode("utf-8"))]
    draws = np.random.default_rng(key).random(len(few_shot))
    return [pair for pair, draw in zip(few_shot, draws) if draw < keep]


# The stream of rewording draws (prompt_variants), apart from a task's problem draws so the numbers never change.
_WORDING_STREAM = 0x5703


def validate_prompt_variants(variants, chance, *placeholders: str) -> None:
    """Raise ValueError naming prompt_variants (each a prompt template with every ``{placeholder}``) or
    prompt_variant_chance (a number in [0, 1], above 0 only with variants to draw)."""
    if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
        raise ValueError(f"prompt_variants must be a list of prompt templates, got {variants!r}")
    for i, variant in enumerate(variants):
        try:
            validate_prompt_template(variant, *placeholders)
        except ValueError as error:
            raise ValueError(f"prompt_variants[{i}]: {error}") from None
    validate_chance(chance, "prompt_variant_chance", "the chance a problem is reworded")
    if chance > 0 and not variants:
        raise ValueError(f"prompt_variant_chance = {chance} rewords problems, but prompt_variants is empty: list the wordings")


def worded_template(template: str, variants: Sequence[str], chance: float, seed: int, index: int) -> str:
    """The prompt template problem ``index`` (of ``seed``) is asked in: one of ``variants`` when its draw is below
    ``chance`` (which one, drawn too), else ``template``. A pure function of (seed, index), drawn apart from the
    problem's numbers; as ``chance`` rises, a reworded problem keeps its wording, so a schedule only adds rewordings."""
    if chance <= 0.0 or not variants:
        return template
    draw, pick = np.random.default_rng([_WORDING_STREAM, seed, index]).random(2)
    return variants[int(pick * len(variants))] if draw < chance else template


def chat_turns(system_prompt: str | None, few_shot: Sequence[tuple[str, str]], prompt: str) -> list[dict[str, str]]:
    """Chat turns: the system prompt, each (prompt, completion) pair as a user and an assistant turn, the prompt."""
    turns = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for example_prompt, completion in few_shot:
        turns += [{"role": "user", "content": example_prompt}, {"role": "assistant", "content": completion}]
    return turns + [{"role": "user", "content": prompt}]
