"""Tools a policy calls in a multi-turn episode: a registry, two built-ins, and the call format.

A tool is a typed Python function: its signature and docstring become the JSON schema a chat
template shows the model (``transformers.utils.get_json_schema``, the schema ``apply_chat_template(tools=...)``
takes). The model calls one by writing, anywhere in its message (the Hermes / Qwen convention)::

    <tool_call>{"name": "calculator", "arguments": {"expression": "123456 * 654321"}}</tool_call>

Nothing a model writes makes a call raise: a malformed call, an unknown tool, bad arguments or a
tool that fails come back as the tool's output with status ``"error"``.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

from rewards.code import CodeLimits, run_code

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
MAX_CALLS_PER_MESSAGE = 4
MAX_OUTPUT_CHARS = 4000
OK, ERROR = "ok", "error"


@dataclass(frozen=True)
class Tool:
    """A callable the model may use: ``schema`` is the JSON schema (``{"type": "function", "function":
    {"name", "description", "parameters"}}``) and ``function`` takes the arguments by name."""

    schema: dict[str, Any]
    function: Callable[..., Any]

    @classmethod
    def from_function(cls, function: Callable[..., Any]) -> Tool:
        """A tool from a function with type hints and a Google-style docstring (``Args:`` describing each
        argument); transformers' ``get_json_schema`` raises naming what is missing."""
        from transformers.utils import get_json_schema

        return cls(get_json_schema(function), function)

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]


@dataclass(frozen=True)
class ToolCall:
    """One parsed call; ``error`` is set (and the call is not run) when the model's text was malformed."""

    name: str
    arguments: dict[str, Any]
    error: str = ""


@dataclass(frozen=True)
class ToolResult:
    content: str
    status: str  # OK, or ERROR when the call could not be made or the tool failed


@dataclass(frozen=True)
class Toolbox:
    """The tools of a task, by name."""

    tools: tuple[Tool, ...] = ()
    by_name: dict[str, Tool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        object.__setattr__(self, "by_name", {tool.name: tool for tool in self.tools})

    @classmethod
    def of(cls, *tools: Tool | Callable[..., Any]) -> Toolbox:
        """Tools, or typed functions turned into tools."""
        return cls(tuple(t if isinstance(t, Tool) else Tool.from_function(t) for t in tools))

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools]

    def __bool__(self) -> bool:
        return bool(self.tools)

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; any failure becomes an error result naming it."""
        if call.error:
            return ToolResult(f"error: {call.error}", ERROR)
        tool = self.by_name.get(call.name)
        if tool is None:
            return ToolResult(f"error: no tool named {call.name!r}; tools: {', '.join(self.by_name)}", ERROR)
        parameters = tool.schema["function"].get("parameters", {})
        missing = sorted(set(parameters.get("required", ())) - set(call.arguments))
        unknown = sorted(set(call.arguments) - set(parameters.get("properties", {})))
        if missing or unknown:
            return ToolResult(f"error: {call.name} missing arguments {missing}, unknown arguments {unknown}", ERROR)
        try:
            output = tool.function(**call.arguments)
        except Exception as exc:  # the model chose the arguments: a failure is its observation, not ours
            return ToolResult(f"error: {type(exc).__name__}: {str(exc)[:500]}", ERROR)
        return ToolResult(str(output)[:MAX_OUTPUT_CHARS], OK)


def parse_tool_calls(message: str) -> list[ToolCall]:
    """The ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks of a message, in order (at most
    MAX_CALLS_PER_MESSAGE; more is an error call). ``arguments`` may also be a JSON string, as some templates write it."""
    calls = []
    for index, body in enumerate(TOOL_CALL.findall(message)):
        if index == MAX_CALLS_PER_MESSAGE:
            calls.append(ToolCall("", {}, f"at most {MAX_CALLS_PER_MESSAGE} tool calls per message"))
            break
        calls.append(_parse_call(body))
    return calls


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as a model writes it: the block ``parse_tool_calls`` reads back as ``ToolCall(name, arguments)``."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _parse_call(body: str) -> ToolCall:
    try:
        call = json.loads(body)
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        return ToolCall("", {}, f"the tool call is not valid JSON ({str(exc)[:100]})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
        return ToolCall("", {}, 'a tool call is {"name": <string>, "arguments": {<name>: <value>, ...}}')
    return ToolCall(call["name"], arguments)


def supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders ``tools=`` itself (it mentions them)."""
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    return isinstance(template, str) and "tools" in template


def tool_instructions(toolbox: Toolbox) -> str:
    """The plain-text fallback, for a model whose chat template has no tool convention: the schemas and the format."""
    schemas = "\n".join(json.dumps(schema) for schema in toolbox.schemas)
    return (
        "You may call tools. Their JSON schemas:\n<tools>\n" + schemas + "\n</tools>\n"
        "To call one, write <tool_call>{\"name\": <tool name>, \"arguments\": {<argument>: <value>}}</tool_call> "
        "and stop; its output comes back as <tool_response>...</tool_response>. "
        "A message without a tool call is your final answer."
    )


# --- Built-in tools -------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 500
MAX_RESULT_BITS = 4096  # ~1233 decimal digits: far past any answer, far below a slow operation
_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _magnitude_bits(value: Fraction) -> int:
    return max(abs(value.numerator).bit_length(), value.denominator.bit_length())


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ValueError("only whole-number exponents")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError("0 to a negative power")
    # |result| has about |exponent| * bits(base) bits: refuse before computing it
    if abs(exponent) * _magnitude_bits(base) > MAX_RESULT_BITS and abs(base) != 1:
        raise ValueError(f"result over {MAX_RESULT_BITS} bits")
    return base ** int(exponent)


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        value = _power(left, right) if isinstance(node.op, ast.Pow) else _BINARY[type(node.op)](left, right)
        if _magnitude_bits(value) > MAX_RESULT_BITS:
            raise ValueError(f"result over {MAX_RESULT_BITS} bits")
        return value
    raise ValueError(f"{type(node).__name__} is not allowed: numbers, + - * / // % ** and parentheses only")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "123456 * 654321" or "(3 + 4) ** 2 / 7".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression over {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not an arithmetic expression: {exc}") from None
    value = _evaluate(tree)
    if value.denominator == 1:
        return str(value.numerator)
    with localcontext() as context:  # a fraction as a decimal to 15 significant digits
        context.prec = 15
        return str(Decimal(value.numerator) / Decimal(value.denominator))


PYTHON_LIMITS = CodeLimits(timeout_s=5.0, cpu_s=4, output_chars=MAX_OUTPUT_CHARS)


def python(code: str) -> str:
    """Run a Python program in a sandbox (no network, no files outside its directory, seconds) and return what it prints.

    Args:
        code: The program; print what you want to see.
    """
    run = run_code(code, limits=PYTHON_LIMITS)
    note = "" if run.status == "ok" else f"\n[{run.status}: {run.reason}]"
    return (run.output or "(no output)") + note
