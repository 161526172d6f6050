"""docs/INTERFACES.md must name what the code offers.

Every dotted name starting with ``rewards.``, ``rlvr_env.`` or ``algos.`` inside the doc's fenced code
blocks must resolve (import the longest importable module prefix, then getattr the rest), and every such
name written as a call, ``qualified.name(param, param2=..., *, kw=...)``, may only name parameters its
``inspect.signature`` has (a class: its constructor), unless it takes ``**kwargs``.

The parser is deliberately small. A call's parenthesised part must close on its line or on the lines
that follow it (a call wrapped over several lines); each of its top-level entries must be ``name``,
``name: annotation``, ``name=default`` (``name:`` / ``name=`` with nothing after is fine too) or one of
``...``, ``*``, ``/``, ``*args``, ``**kwargs``, which are skipped. Anything else (a bare value such as
``[(name, fn, weight), ...]``) is reported, so the doc keeps writing parameter names. No line is skipped.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "INTERFACES.md"
ROOTS = ("rewards", "rlvr_env", "algos")
# a dotted name with one of our roots, not inside a longer dotted name or a path (docs/rewards.md)
REF_RE = re.compile(r"(?<![\w./])(?:" + "|".join(ROOTS) + r")(?:\.[A-Za-z_]\w*)+")
# `module.{a, b, c}` names module.a, module.b and module.c
BRACES_RE = re.compile(r"\.\{([\w\s,]*)\}")
IDENT_RE = re.compile(r"[A-Za-z_]\w*$")
SKIPPED_ENTRIES = {"...", "*", "/"}
OPENERS, CLOSERS = "([{", ")]}"


@dataclass(frozen=True)
class Ref:
    """One dotted name in the doc: where it is, and the text after it on its line and the following ones."""

    name: str
    line: int  # 1-based line number in the doc
    rest: str  # the doc's text right after the name (its own line, then the next lines)


def code_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The fenced code blocks of a markdown text, as (line number of the first line, lines)."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if current is None:
                current, start = [], number + 1
            else:
                blocks.append((start, current))
                current = None
        elif current is not None:
            current.append(line)
    assert current is None, "unclosed code block in docs/INTERFACES.md"
    return blocks


def find_refs(text: str) -> list[Ref]:
    """Every dotted reference in the code blocks, brace groups (`algos.algorithms.grpo.{A, B}`) expanded."""
    refs = []
    for start, lines in code_blocks(text):
        for offset, line in enumerate(lines):
            following = "\n".join([line, *lines[offset + 1 :]])
            for match in REF_RE.finditer(line):
                rest = following[match.end() :]
                refs.append(Ref(match.group(), start + offset, rest))
                if rest.startswith(".{"):  # a brace group may go on over the next lines
                    braces = BRACES_RE.match(rest)
                    assert braces, f"line {start + offset}: {match.group()}.{{...}} must be names and commas, closed"
                    refs += [Ref(f"{match.group()}.{n.strip()}", start + offset, "") for n in braces.group(1).split(",")]
    return refs


def resolve(name: str):
    """Import the longest importable module prefix of `name`, then getattr the rest; raises on failure."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # only "this name is not a module" moves on to a shorter prefix; a broken import is a failure
            if error.name is None or not module_name.startswith(error.name):
                raise
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(name)


def _depths(text: str):
    """Each (index, character, bracket depth after it) of ``text``, with quoted characters at no depth change."""
    depth, quote = 0, None
    for index, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in OPENERS:
            depth += 1
        elif char in CLOSERS:
            depth -= 1
        yield index, char, depth, quote


def call_arguments(rest: str) -> str | None:
    """The text inside the parentheses that open `rest`, or None when `rest` is not a call.

    Brackets and quotes nest; raises ValueError when the parenthesis never closes."""
    if not rest.startswith("("):
        return None
    for index, char, depth, quote in _depths(rest):
        if char in CLOSERS and not quote and depth == 0:
            return rest[1:index]
    raise ValueError("the call's parenthesis never closes")


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes; entries stripped, empty ones dropped."""
    entries, start = [], 0
    for index, char, depth, quote in _depths(text):
        if char == "," and depth == 0 and not quote:
            entries.append(text[start:index])
            start = index + 1
    entries.append(text[start:])
    return [" ".join(entry.split()) for entry in entries if entry.strip()]


def parameter_name(entry: str) -> str | None:
    """The parameter an entry names (`name`, `name: ann`, `name=default`); None for a skipped entry.

    Raises ValueError when the entry names no parameter (a bare value)."""
    if entry in SKIPPED_ENTRIES or entry.startswith("*"):
        return None
    name = re.split(r"[:=]", entry, maxsplit=1)[0].strip()
    if not IDENT_RE.match(name):
        raise ValueError(f"{entry!r} is not a parameter (write name, name: annotation or name=default)")
    return name


def signature_mismatches(ref: Ref, obj, arguments: str) -> list[str]:
    """The doc's parameters of one call that the object's signature lacks, as messages."""
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError) as error:
        return [f"line {ref.line}: {ref.name}(...): no signature ({error})"]
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    problems = []
    for entry in split_top_level(arguments):
        try:
            name = parameter_name(entry)
        except ValueError as error:
            problems.append(f"line {ref.line}: {ref.name}: {error}")
            continue
        if name is not None and name not in parameters and not takes_kwargs:
            problems.append(f"line {ref.line}: {ref.name} has no parameter {name!r} (it has {', '.join(parameters)})")
    return problems


@pytest.fixture(scope="module")
def refs() -> list[Ref]:
    found = find_refs(DOC.read_text(encoding="utf-8"))
    assert found, "no references found in docs/INTERFACES.md"
    return found


def test_every_reference_resolves(refs):
    unresolved = []
    for ref in refs:
        try:
            resolve(ref.name)
        except Exception as error:  # any failure to resolve is the finding
            unresolved.append(f"line {ref.line}: {ref.name} ({type(error).__name__}: {error})")
    assert not unresolved, "docs/INTERFACES.md names what does not exist:\n" + "\n".join(unresolved)


def test_every_documented_call_matches_its_signature(refs):
    problems, calls = [], 0
    for ref in refs:
        try:
            arguments = call_arguments(ref.rest)
        except ValueError as error:
            problems.append(f"line {ref.line}: {ref.name}: {error}")
            continue
        if arguments is None:
            continue
        calls += 1
        try:
            obj = resolve(ref.name)
        except Exception:  # test_every_reference_resolves reports it
            continue
        problems += signature_mismatches(ref, obj, arguments)
    assert calls, "no calls found in docs/INTERFACES.md"
    assert not problems, "docs/INTERFACES.md's signatures differ from the code:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("arguments", "names"),
    [
        ("code, tests, setup=, limits=CodeLimits(...)", ["code", "tests", "setup", "limits"]),
        ("pred: str, gold: str, *, timeout: float | None = None", ["pred", "gold", "timeout"]),
        ('device="cpu, gpu", overrides=[a, b] | {c: d}, **kwargs, ...', ["device", "overrides"]),
        ("*args, /, x", ["x"]),
    ],
)
def test_parser(arguments, names):
    parsed = [parameter_name(entry) for entry in split_top_level(arguments)]
    assert [name for name in parsed if name is not None] == names


def test_parser_refuses_values_and_unclosed_calls():
    with pytest.raises(ValueError):
        parameter_name("[(name, verifier, weight), ...]")
    with pytest.raises(ValueError):
        call_arguments("(a, b")
    assert call_arguments("(a, (b, c)) -> d(e)") == "a, (b, c)"
    assert call_arguments(": not a call") is None
