"""Turning a task's chat turns into the prompt text a model sees."""

from __future__ import annotations

from collections.abc import Sequence


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
