"""Tiny character-level models that call the calculator: the multi-turn tests' starting points."""

from __future__ import annotations

import json

import torch

from rlvr_env import make_task
from rlvr_env.multiturn_env import render_conversation
from rlvr_env.testing import build_char_tokenizer, build_tiny_model, supervise_and_save

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
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def calculator_model(path, steps: int = 300, tool_fraction: float = 0.5, seed: int = 0, hidden_size: int = 128):
    """Save (to ``path``) a tiny model supervised ``steps`` AdamW steps on conversations of the calculator task: a
    ``tool_fraction`` of them call the calculator with the problem's expression and answer with its output, the rest
    answer at once with a wrong guess. Greedy decoding so guesses (accuracy ~0); sampling calls the tool often
    enough for a verifiable reward to reinforce. The texts are rendered as the rollout renders them, each message
    followed by the EOS the policy stops with."""
    tokenizer = tool_tokenizer()
    task = make_task("rlvr/CalculatorArithmetic-v0", **TASK_KWARGS)
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=2, seed=seed)
    model.config.max_position_embeddings = 1024
    generator = torch.Generator().manual_seed(seed)

    def batch() -> list[str]:
        texts = []
        for index in torch.randint(0, 10**6, (32,), generator=generator).tolist():
            problem = task.problem(index, 999)
            messages = task.messages(problem)
            if torch.rand(1, generator=generator).item() < tool_fraction:
                call = tool_call(problem.metadata["expression"])
                prompt = render_conversation(messages, tokenizer, task.tools)
                after = [*messages, {"role": "assistant", "content": call}, {"role": "tool", "content": problem.answer}]
                observation = render_conversation(after, tokenizer, task.tools)[len(prompt) + len(call) :]
                texts.append(prompt + call + tokenizer.eos_token + observation + problem.answer + tokenizer.eos_token)
            else:
                guess = str(int(torch.randint(100, 9999, (1,), generator=generator)))
                texts.append(render_conversation(messages, tokenizer, task.tools) + guess + tokenizer.eos_token)
        return texts

    return supervise_and_save(model, tokenizer, (batch() for _ in range(steps)), path, add_special_tokens=False)
