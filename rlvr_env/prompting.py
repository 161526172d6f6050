"""Turning a task's chat turns into the prompt text a model sees."""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jinja2 import TemplateError

from rlvr_env.task import validate_prompt_template

# apply_chat_template's own arguments: a template switch by one of these names would never reach the template.
_APPLY_ARGUMENTS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
    "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs",
})


def validate_chat_template_kwargs(kwargs) -> None:
    """Raise ValueError naming chat_template_kwargs unless it is a mapping of template variable names (str) to
    values, none of them one of apply_chat_template's own arguments (tokenize, tools, ...)."""
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"chat_template_kwargs must be a mapping of template variables "
                         f"(e.g. {{enable_thinking: false}}), got {kwargs!r}")
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"chat_template_kwargs: {name!r} is not a template variable name")
        if name in _APPLY_ARGUMENTS:
            raise ValueError(f"chat_template_kwargs: {name!r} is apply_chat_template's own argument, set by the "
                             f"rollout, not a template variable")


def chat_text(tokenizer, messages: Sequence[dict[str, str]], chat_template_kwargs: Mapping[str, Any] | None = None,
              **options) -> str:
    """``messages`` through ``tokenizer``'s chat template, ending with the generation prompt. ``options`` (tools)
    and ``chat_template_kwargs`` (the template's own variables, e.g. Qwen3's enable_thinking, as TRL's and verl's
    chat_template_kwargs) reach the template. A template that refuses a leading system turn (Gemma 2's raises
    "System role not supported") gets the system text folded into the first user turn, as Gemma 3's own template
    does, with a warning; any other refusal is a ValueError that quotes the template's message."""
    turns, variables = list(messages), {**(chat_template_kwargs or {}), **options}

    def apply(conversation):
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, **variables)

    try:
        return apply(turns)
    except TemplateError as error:
        refusal = error
    folded = _system_folded(turns)
    if folded is not None:
        try:
            text = apply(folded)
        except TemplateError:
            pass
        else:
            warnings.warn(f"the chat template refuses a system turn ({refusal}): the system prompt is folded into the "
                          f"first user turn, as Gemma 3's template does", stacklevel=2)
            return text
    roles = [turn["role"] for turn in turns]
    raise ValueError(f"the tokenizer's chat template refuses a conversation of roles {roles}: {refusal}") from None


def _system_folded(turns: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """``turns`` with a leading system turn's text put before the first user turn's (a blank line between);
    None when there is no system turn followed by a user turn to fold it into."""
    if len(turns) < 2 or turns[0]["role"] != "system" or turns[1]["role"] != "user":
        return None
    first = {**turns[1], "content": f"{turns[0]['content']}\n\n{turns[1]['content']}"}
    return [first, *turns[2:]]


def render_prompt(messages: Sequence[dict[str, str]], tokenizer=None, use_chat_template: bool = True,
                  chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """Chat turns -> prompt text: through the tokenizer's chat template when it has
    one (``chat_text``), else plain text with turns separated by blank lines (what a
    base model continues)."""
    if uses_chat_template(tokenizer, use_chat_template):
        return chat_text(tokenizer, messages, chat_template_kwargs)
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
