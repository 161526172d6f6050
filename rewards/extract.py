"""Find the final answer in a model response (SPEC.md 'extraction order').

Order: the last \\boxed{} / \\fbox{} (balanced braces), then the last
<answer>...</answer>, then "the (final) answer is ...", "Final Answer:",
"Answer:", GSM8K's "#### 42", then a short response taken whole (a bare answer
such as "(2,4)" or "3+2x"). A long response with none of these has no answer:
a number that appears only in the working never counts. All scans are linear.
"""

from __future__ import annotations

import re

SHORT_ANSWER_CHARS = 80  # a response this short with no marker is itself the answer

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*(\{)|\\boxed +([^\s${}]+)")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_IS_RE = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:)\s*(?::\s*)?(.+?)(?:\.\s|\.$|\n|$|\s*I hope)", re.I
)
_GSM8K_RE = re.compile(r"####\s*([^\n]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} with balanced braces (or `\\boxed 5`)."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    while start >= 0:
        match = _BOX_RE.match(text, start)
        if match:
            if match.group(2) is not None:
                return match.group(2)
            content = _balanced(text, match.end(1))
            if content is not None:
                return content
        start = max(text.rfind("\\boxed", 0, start), text.rfind("\\fbox", 0, start))
    return None


def _balanced(text: str, begin: int) -> str | None:
    depth = 1
    for i in range(begin, len(text)):
        ch = text[i]
        if ch == "{" and text[i - 1] != "\\":
            depth += 1
        elif ch == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[begin:i]
    return None


def _last_match(pattern: re.Pattern, text: str) -> str | None:
    last = None
    for match in pattern.finditer(text):
        last = match
    return last.group(1).strip() if last else None


def extract_answer(text: str) -> str | None:
    """The final answer of a response, or None when it gives none."""
    if not isinstance(text, str) or not text.strip():
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if "<answer>" in text.lower():
        tagged = _last_match(_ANSWER_TAG_RE, text)
        if tagged is not None:
            inner = last_boxed(tagged)
            return (inner if inner is not None else tagged).strip()
    if "answer" in text.lower():
        stated = _last_match(_ANSWER_IS_RE, text)
        # "Final Answer: The final answer is 28" -> the innermost statement
        while stated and "answer" in stated.lower() and _ANSWER_IS_RE.search(stated):
            stated = _last_match(_ANSWER_IS_RE, stated)
        if stated:
            return stated.strip().rstrip(".").strip()
    if "####" in text:
        marked = _last_match(_GSM8K_RE, text)
        if marked:
            return marked
    stripped = text.strip()
    if len(stripped) <= SHORT_ANSWER_CHARS and "\n" not in stripped:
        return stripped
    return None
