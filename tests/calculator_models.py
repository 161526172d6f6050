"""Tiny character-level models that call the calculator: the multi-turn tests' starting points."""

from __future__ import annotations

import json

import torch

from rlvr_env import make_task
from rlvr_env.multiturn_env import render_conversation
from rlvr_env.testing import build_char_tokenizer, build_tiny_model

# 2-digit products: out of a tiny model's reach, one calculator call away.
TASK_KWARGS = {"digits": 2, "operators": "*", "prompt_template": "{expression}=", "format_weight": 0.0, "max_turns": 3}
# A chat template that renders tools its own way (one line naming them), so prompts stay short: the tool instructions
# a template without tools gets in its system message would be most of a tiny model's context.
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}S:calculator\n{% endif %}"
    "{% for m in messages %}{{ m['role'][0] | upper }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def tool_tokenizer():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def tool_call(expression: str) -> str:
    """The calculator call the tiny models write: compact JSON, arguments first, so the expression the model copies
    from the prompt stands as near to it as the call format allows."""
    body = json.dumps({"arguments": {"expression": expression}, "name": "calculator"}, separators=(",", ":"))
    return "<tool_call>" + body + "</tool_call>"


def calculator_model(path, steps: int = 400, tool_fraction: float = 0.25, seed: int = 0, hidden_size: int = 128,
                     lr: float = 3e-3):
    """Save (to ``path``) a tiny model that, asked a 2-digit product, calls the calculator on a ``tool_fraction`` of
    its samples and copies the result out as its answer; otherwise it guesses at once (the two operands written side
    by side, never the product). Greedy decoding so guesses (accuracy ~0), while sampling calls the tool often enough
    for a verifiable reward to reinforce the call.

    ``steps`` AdamW steps (``lr``), each on 64 problems, a ``tool_fraction`` of them tool conversations and the rest
    guesses (one token-mean loss over them, so a ``tool_fraction`` of first tokens open a call), plus 32 copy drills
    (``"\nT:4920\nA:"`` -> ``"4920"``, random 3- and 4-digit numbers) whose mean loss is added. The loss covers the
    policy's tokens only, as RL's does: the tool outputs are context, so the model is not pushed to compute products
    instead of copying them. Both copies (the expression into the call, the result into the answer) are fixed-offset
    attention a tiny model only finds late in a long context; the drills, short and without a product to guess,
    form the result copy in a few dozen steps, and the conversations carry it over. The texts are rendered as the
    rollout renders them, each message followed by the EOS the policy stops with."""
    tokenizer = tool_tokenizer()
    task = make_task("rlvr/CalculatorArithmetic-v0", **TASK_KWARGS)
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=2, seed=seed, max_position_embeddings=1024)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    eos = tokenizer.eos_token
    tools = round(64 * tool_fraction)  # of the 64 problems of a step; the others are guessed

    def row(*segments: tuple[str, bool]) -> tuple[list[int], list[int]]:
        """Token ids and labels (-100 where ``trained`` is False) of consecutive text segments."""
        ids, labels = [], []
        for text, trained in segments:
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += tokens
            labels += tokens if trained else [-100] * len(tokens)
        return ids, labels

    def loss_sum(rows) -> tuple[torch.Tensor, int]:
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in rows])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in rows])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
        count = int((labels[:, 1:] != -100).sum())
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss * count, count

    for _ in range(steps):
        conversations, short = [], []
        for n, index in enumerate(torch.randint(0, 10**6, (64,), generator=generator).tolist()):
            problem = task.problem(index, 999)
            messages, expression = task.messages(problem), problem.metadata["expression"]
            prompt = render_conversation(messages, tokenizer, task.tools)
            if n < tools:
                call = tool_call(expression)
                after = [*messages, {"role": "assistant", "content": call}, {"role": "tool", "content": problem.answer}]
                observation = render_conversation(after, tokenizer, task.tools)[len(prompt) + len(call) :]
                conversations.append(row((prompt, False), (call + eos, True), (observation, False),
                                         (problem.answer + eos, True)))
            else:
                short.append(row((prompt, False), (expression.replace(" * ", "") + eos, True)))
        numbers = torch.randint(1000, 10000, (32,), generator=generator).tolist()
        cut = (torch.rand(32, generator=generator) < 0.5).tolist()
        drills = [row((f"{eos}\nT:{str(r)[:3] if c else r}\nA:", False), ((str(r)[:3] if c else str(r)) + eos, True))
                  for r, c in zip(numbers, cut)]
        (long_sum, long_count), (short_sum, short_count) = loss_sum(conversations), loss_sum(short)
        drill_sum, drill_count = loss_sum(drills)
        loss = (long_sum + short_sum) / (long_count + short_count) + drill_sum / drill_count
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def raise_eos(model, tokenizer, env, strength: float) -> None:
    """Add ``strength`` x (a mean head row's norm) to the EOS row of ``model``'s head, along the mean of its last
    hidden states over ``env``'s prompts: a random model then ends its messages early (strength ~1: some messages
    hold tokens, others are empty) or at once (>= 2), so its episodes run several turns."""
    with torch.no_grad():
        hidden = model.model(input_ids=env.prompt_ids, attention_mask=env.prompt_mask).last_hidden_state
        direction = hidden[env.prompt_mask.bool()].mean(0)
        head = model.get_output_embeddings().weight
        head[tokenizer.eos_token_id] += strength * direction / direction.norm() * head.norm(dim=1).mean()
