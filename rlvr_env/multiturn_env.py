"""MultiTurnEnv: observation = the conversation so far, action = the assistant's next message.

A step appends the message; then, in this order:

- it calls tools (``<tool_call>...</tool_call>``, see :mod:`rlvr_env.tools`): each output is appended as a
  ``{"role": "tool"}`` message and the episode goes on;
- or the task replies (:meth:`MultiTurnTask.reply`, e.g. "higher" in a guessing game): appended as a user
  message, with that turn's reward;
- or it is the final answer: the task's verifier scores it and the episode ends (``terminated``).

``max_turns`` assistant messages (the task's config), or a rendered conversation over ``max_context_tokens``
(with a tokenizer), end the episode first (``truncated``, reward 0 for the outcome: no final answer).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from rewards.result import NO_ANSWER, VerifyResult
from rlvr_env.completion_env import outcome_info, problem_from_options
from rlvr_env.prompting import chat_text, validate_chat_template_kwargs
from rlvr_env.registry import make_task
from rlvr_env.spaces import UnicodeText
from rlvr_env.task import Problem, Task, TaskConfig
from rlvr_env.tools import Toolbox, parse_tool_calls, supports_tools, tool_instructions

MAX_ROLE_CHARS = 16


@dataclass
class MultiTurnConfig(TaskConfig):
    """``max_turns``: assistant messages per episode (tool calls and moves included); the next one past it truncates."""

    max_turns: int = 6

    def validate(self) -> None:
        super().validate()
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or not 1 <= self.max_turns <= 100:
            raise ValueError(f"max_turns must be an integer in 1..100, got {self.max_turns!r}")


@dataclass(frozen=True)
class Reply:
    """The environment's answer to a move: the next user message, and that turn's reward."""

    content: str
    reward: float = 0.0


class MultiTurnTask(Task):
    """A task played over several turns. ``gymnasium.make`` of its id gives a MultiTurnEnv; the single-turn
    views (CompletionEnv, TokenEnv, TokenVectorEnv) still work on it, scoring one completion as the final
    answer, without tools or replies."""

    config_cls: ClassVar[type[TaskConfig]] = MultiTurnConfig
    env_entry_point: ClassVar[str] = "rlvr_env.multiturn_env:make_multiturn_env"

    @property
    def tools(self) -> Toolbox:
        """The tools the policy may call; none by default."""
        return Toolbox()

    def reply(self, problem: Problem, messages: list[dict[str, str]]) -> Reply | None:
        """The answer to the last assistant message of ``messages`` when it calls no tool: a Reply continues
        the episode, None (the default) makes that message the final answer."""
        return None


def render_conversation(messages, tokenizer=None, toolbox: Toolbox | None = None,
                        chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The prompt for the next assistant message. With a chat template (``chat_text``, given
    ``chat_template_kwargs``): the tools through ``apply_chat_template(tools=...)`` when the template renders
    them, tool outputs as ``<tool_response>`` user turns when it has no tool role; without one, ``role: content``
    blocks."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        if supports_tools(tokenizer):
            return chat_text(tokenizer, messages, chat_template_kwargs, tools=toolbox.schemas if toolbox else None)
        turns = [
            {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"} if m["role"] == "tool" else m
            for m in messages
        ]
        return chat_text(tokenizer, turns, chat_template_kwargs)
    return "".join(f"{m['role']}: {m['content']}\n\n" for m in messages) + "assistant: "


def with_tool_instructions(messages: list[dict[str, str]], toolbox: Toolbox, tokenizer=None) -> list[dict[str, str]]:
    """An episode's first ``messages`` (its task's), with the plain-text tool instructions in the system message when
    there are tools and ``tokenizer``'s chat template does not render them (or there is none)."""
    if not toolbox or supports_tools(tokenizer):
        return messages
    system = [m["content"] for m in messages[:1] if m["role"] == "system"]
    rest = messages[1:] if system else messages
    return [{"role": "system", "content": "\n\n".join([*system, tool_instructions(toolbox)])}, *rest]


class MultiTurnEnv(gym.Env):
    """Gymnasium's API over a MultiTurnTask.

    Observation: a tuple of ``{"role", "content"}`` dicts (``spaces.Sequence`` of ``spaces.Dict`` of text),
    ready for ``apply_chat_template``; with tools and no template that renders them, the system message
    holds the plain-text tool instructions. Action: the assistant's message (str; longer than
    ``max_message_chars`` is cut there). Reward: the reply's reward on a move, the verifier's score on the
    final answer. ``info``: ``prompt`` (the rendered conversation to generate from), ``turn``, ``tool_calls``
    (every call so far: turn, name, arguments, status), ``tool_errors``; at the end also CompletionEnv's
    outcome (``answer``, ``reward_components``, ``verifier_status``, ``success``).
    """

    metadata = {"render_modes": []}

    def __init__(self, task: MultiTurnTask, tokenizer=None, max_message_chars: int = 8192,
                 max_context_tokens: int | None = None, problem_seed: int = 0,
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        if not isinstance(task, MultiTurnTask):
            raise ValueError(f"MultiTurnEnv needs a MultiTurnTask, got {type(task).__name__}")
        if max_message_chars < 1:
            raise ValueError(f"max_message_chars must be positive, got {max_message_chars}")
        if max_context_tokens is not None and (tokenizer is None or max_context_tokens < 1):
            raise ValueError("max_context_tokens needs a tokenizer and must be positive")
        validate_chat_template_kwargs(chat_template_kwargs)
        self.task = copy.copy(task)  # reset options reconfigure this env's copy, never the caller's task
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.toolbox = self.task.tools
        self.max_message_chars = max_message_chars
        self.max_context_tokens = max_context_tokens
        self.problem_seed = problem_seed
        message = spaces.Dict({"role": UnicodeText(MAX_ROLE_CHARS, min_length=1), "content": UnicodeText(max_message_chars)})
        self.observation_space = spaces.Sequence(message, stack=False)
        self.action_space = UnicodeText(max_message_chars)
        self.problem: Problem | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        index, problem = problem_from_options(self.task, self.np_random, self.problem_seed, options)
        observation, info = self.start(problem)
        return observation, {**info, "problem_index": int(index)}

    def start(self, problem: Problem):
        """Begin an episode on ``problem`` itself, as reset does on the one it draws (a batched rollout's rows play
        problems drawn elsewhere): reset's observation and info, less ``problem_index``."""
        self.problem = problem
        self.messages = with_tool_instructions(self.task.messages(problem), self.toolbox, self.tokenizer)
        too_long = [m for m in self.messages if len(m["content"]) > self.max_message_chars]
        if too_long:
            raise ValueError(f"problem {problem.metadata.get('index', '')} has a message of "
                             f"{len(too_long[0]['content'])} characters > max_message_chars")
        self.turn, self.tool_calls = 0, []
        return self._observation(), {**self._info(), "tools": self.toolbox.schemas}

    def step(self, action: str):
        if self.problem is None:
            raise RuntimeError("call reset() before step(), and again after an episode ends")
        if not isinstance(action, str):
            raise TypeError(f"action must be the assistant's message (str), got {type(action).__name__}")
        message = action[: self.max_message_chars]
        self.messages.append({"role": "assistant", "content": message})
        self.turn += 1
        calls = parse_tool_calls(message) if self.toolbox else []
        reward, final = 0.0, None
        if calls:
            for call in calls:
                result = self.toolbox.call(call)
                self.messages.append({"role": "tool", "content": result.content[: self.max_message_chars]})
                self.tool_calls.append(
                    {"turn": self.turn, "name": call.name, "arguments": call.arguments, "status": result.status}
                )
        elif (reply := self.task.reply(self.problem, list(self.messages))) is not None:
            self.messages.append({"role": "user", "content": reply.content[: self.max_message_chars]})
            reward = float(reply.reward)
        else:
            final = self.task.verify(message, self.problem)
            reward += float(final.score)
        out_of_budget = final is None and (self.turn >= self.task.config.max_turns or self._over_context())
        info = self._info()
        if final is not None or out_of_budget:
            outcome = final or VerifyResult(0.0, NO_ANSWER, {"reason": "turn or context budget spent"})
            info.update(outcome_info(self.task, self.problem, outcome))
            self.problem = None
        return self._observation(), reward, final is not None, out_of_budget, info

    def _over_context(self) -> bool:
        if self.max_context_tokens is None:
            return False
        prompt = render_conversation(self.messages, self.tokenizer, self.toolbox, self.chat_template_kwargs)
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) > self.max_context_tokens

    def _observation(self) -> tuple[dict[str, str], ...]:
        return tuple(dict(m) for m in self.messages)

    def _info(self) -> dict[str, Any]:
        return {
            "prompt": render_conversation(self.messages, self.tokenizer, self.toolbox, self.chat_template_kwargs),
            "turn": self.turn,
            "tool_calls": [dict(c) for c in self.tool_calls],
            "tool_errors": sum(c["status"] != "ok" for c in self.tool_calls),
        }


# MultiTurnEnv's own keyword arguments; everything else given to gymnasium.make is a task config field.
ENV_ARGUMENTS = ("tokenizer", "max_message_chars", "max_context_tokens", "problem_seed", "chat_template_kwargs")


def make_multiturn_env(task_id: str, **kwargs: Any) -> MultiTurnEnv:
    """Gymnasium entry point of every registered MultiTurnTask id."""
    env_kwargs = {key: kwargs.pop(key) for key in ENV_ARGUMENTS if key in kwargs}
    return MultiTurnEnv(make_task(task_id, **kwargs), **env_kwargs)
