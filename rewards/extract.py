"""Find the final answer in a model response (SPEC.md 'extraction order').

Order: the last \\boxed{} / \\fbox{} (balanced braces), then the last
<answer>...</answer>, then "the (final) answer is ...", "Final Answer:",
"Answer:" (also markdown "**Answer:**", "**Final Answer**:"), GSM8K's "#### 42",
then a short response taken whole (a bare answer such as "(2,4)" or "3+2x"). A
long response with none of these has no answer: a number that appears only in
the working never counts. All scans are linear in the response's length (math
spans and <answer> tags are paired by hand: a lazy regex rescans the rest of the
text from every unclosed opener), as the default in-process path has no time limit.

Several boxes in the final sentence are read together: joined by "or" they are
a hedge (scored wrong), joined only by "and"/commas they are one list answer;
boxes in earlier sentences are revisions, and the last box wins. A "Final
Answer:" statement written after the last box is the response's last word.
A stated answer that is a sentence ("The volume is 120", "$x \\ge 5$ is the
solution") is reduced to its value: what follows the last "is", else its one
math span.
"""

from __future__ import annotations

import re

SHORT_ANSWER_CHARS = 80  # a response this short with no marker is itself the answer

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*(\{)|\\boxed +([^\s${}]+)")
_BRACE_RE = re.compile(r"(?<!\\)[{}]")
_ANSWER_TAG_RE = re.compile(r"<(/?)answer>", re.I)
# "Answer:", "The final answer is", markdown "**Answer:**" / "**Final Answer**:", or "Answer $9$" at a line start
_ANSWER_MARKER = (
    r"(?:(?:final answer|the answer|answer)\s*(?:\*+[ \t]*)?(?:is|:)(?:\*+(?=\s))?\s*(?::\s*)?"
    r"|^[ \t]*(?:final )?answer\s*(?=\$|\\[(\[]))"
)
_ANSWER_MARKER_RE = re.compile(_ANSWER_MARKER, re.I | re.M)
_ANSWER_IS_RE = re.compile(_ANSWER_MARKER + r"(.+?)(?:\.\s|\.$|\n|$|\s*I hope)", re.I | re.M)
_SENTENCE_END_RE = re.compile(r"[.!?](?:\s|$)|\n\s*\n")
_HEDGE_RE = re.compile(r"\bor\b", re.I)
_LIST_JOINER_RE = re.compile(r"(?:\s|\$|\\[()\[\]]|[,;&]|\\q?quad\b|\\text\s*\{\s*and\s*\}|\band\b)*")
_MATH_OPENER_RE = re.compile(r"\$|\\[(\[]")
_MATH_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_PROSE_RE = re.compile(r"(?<![\\a-zA-Z])(?!(?:or|and)\b)[a-zA-Z]{2,}")  # "or"/"and" join values: no reduction
_COPULA_RE = re.compile(r"\s(?:is|are|was|equals)\s(?!not\b)", re.I)
_BOLD_RE = re.compile(r"^\*\*(.+)\*\*$", re.S)
_GSM8K_RE = re.compile(r"####\s*([^\n]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} with balanced braces (or `\\boxed 5`)."""
    return next((content for _, _, content in _boxes_from_last(text)), None)


def _boxes_from_last(text: str):
    """(start, end, content) of each well-formed box, the last one first (linear: braces matched once)."""
    boxes = list(_BOX_RE.finditer(text))
    closing = _matching_braces(text) if boxes else {}
    for match in reversed(boxes):
        if match.group(2) is not None:
            yield match.start(), match.end(), match.group(2)
        elif match.start(1) in closing:
            end = closing[match.start(1)]
            yield match.start(), end + 1, text[match.end(1):end]


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each unescaped '{' -> index of its matching '}'; unbalanced ones are left out."""
    closing, stack = {}, []
    for brace in _BRACE_RE.finditer(text):
        if brace.group() == "{":
            stack.append(brace.start())
        elif stack:
            closing[stack.pop()] = brace.start()
    return closing


def final_boxed(text: str) -> tuple[str, int] | None:
    """The boxed answer of the final sentence and where it ends: a hedge, a list, or the last box."""
    group: list[tuple[int, int, str]] = []  # boxes of the final sentence, last first
    for box in _boxes_from_last(text):
        if group and _SENTENCE_END_RE.search(text, box[1], group[-1][0]):
            break
        group.append(box)
    if not group:
        return None
    end = group[0][1]
    contents = list(dict.fromkeys(content.strip() for _, _, content in reversed(group)))
    if len(contents) == 1:
        return contents[0], end
    joiners = [text[later[1]:earlier[0]] for earlier, later in zip(group, group[1:])]
    if any(_HEDGE_RE.search(joiner) for joiner in joiners):
        return " or ".join(contents), end  # "either 4 or 6": not a value, so it scores wrong
    if all(_LIST_JOINER_RE.fullmatch(joiner) for joiner in joiners):
        return ", ".join(contents), end  # "\\boxed{-2} and \\boxed{1}": the answers together
    return group[0][2].strip(), end  # a revision within the sentence


def _last_match(pattern: re.Pattern, text: str) -> str | None:
    last = None
    for match in pattern.finditer(text):
        last = match
    return last.group(1).strip() if last else None


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of each $$..$$, $..$, \\(..\\) and \\[..\\] span, left to right, non-overlapping.

    The spans a lazy regex (`\\$(.+?)\\$|...`) finds, in linear time: that regex rescans to the
    end of the text from every unclosed opener, quadratic on "\\(" * n.
    """
    spans: list[tuple[int, int, str]] = []
    searched: dict[str, tuple[int, int]] = {}  # closer -> (searched from, found at): each stretch is scanned once

    def next_closer(closer: str, start: int) -> int:
        known = searched.get(closer)
        if known and known[0] <= start and (known[1] == -1 or known[1] >= start):
            return known[1]
        found = text.find(closer, start)
        searched[closer] = (start, found)
        return found

    position = 0
    while (opener := _MATH_OPENER_RE.search(text, position)) is not None:
        start = opener.start()
        candidates = ["$$", "$"] if text.startswith("$$", start) else [opener.group()]
        for delimiter in candidates:
            inner = start + len(delimiter)
            close = next_closer(_MATH_CLOSER[delimiter], inner + 1)  # the content is at least one character
            if close != -1:
                spans.append((start, close + len(delimiter), text[inner:close]))
                position = close + len(delimiter)
                break
        else:
            position = start + 1
    return spans


def _unbolded(sentence: str) -> tuple[str, list[tuple[int, int, str]]]:
    """The sentence stripped of surrounding whitespace and `**bold**`, and its math spans."""
    sentence = sentence.strip()
    bold = _BOLD_RE.match(sentence)
    if bold:
        sentence = bold.group(1).strip()
    return sentence, _math_spans(sentence)


def _has_prose(sentence: str, spans: list[tuple[int, int, str]]) -> bool:
    """Words outside the math spans (not a bare value such as "$5$ and $6$")."""
    pieces, last_end = [], 0
    for start, end, _ in spans:
        pieces.append(sentence[last_end:start])
        last_end = end
    pieces.append(sentence[last_end:])
    return _PROSE_RE.search(" ".join(pieces)) is not None


def _last_copula_outside(sentence: str, spans: list[tuple[int, int, str]]) -> re.Match | None:
    """The last "is"/"are"/"was"/"equals" not inside a math span (spans are sorted: one pointer walks them)."""
    last, span_index = None, 0
    for copula in _COPULA_RE.finditer(sentence):
        while span_index < len(spans) and spans[span_index][1] <= copula.start():
            span_index += 1
        inside = span_index < len(spans) and spans[span_index][0] < copula.start()
        if not inside:
            last = copula
    return last


def answer_in_sentence(sentence: str) -> str:
    """The value a sentence states: 'The volume of $V$ is 120' -> '120', '$x \\ge 5$ is the solution' -> 'x \\ge 5'."""
    sentence, spans = _unbolded(sentence)
    if not _has_prose(sentence, spans):
        return sentence
    copula = _last_copula_outside(sentence, spans)
    if copula is not None:
        tail, tail_spans = _unbolded(sentence[copula.end():])
        # the tail's spans are the sentence's own, so it has no copula left to reduce: one step is final
        if re.search(r"[\d$\\]", tail):
            return tail_spans[0][2].strip() if len(tail_spans) == 1 and _has_prose(tail, tail_spans) else tail
    return spans[0][2].strip() if len(spans) == 1 else sentence


def _stated_answer(text: str) -> str | None:
    """The value after the last "the answer is" / "Final Answer:" / "Answer $...$", if any."""
    if "answer" not in text.lower():
        return None
    stated = _last_match(_ANSWER_IS_RE, text)
    if stated:
        # "Final Answer: The final answer is 28" -> the innermost statement: what follows its last marker
        inner = None
        for marker in _ANSWER_MARKER_RE.finditer(stated):
            if marker.end() < len(stated):
                inner = marker
        if inner is not None:
            stated = stated[inner.end():].strip()
    return answer_in_sentence(stated.rstrip(".").strip()) if stated else None


def _last_tagged(text: str) -> str | None:
    """Content of the last <answer>...</answer>, pairing each opener with the next closer (linear)."""
    opened, last = None, None
    for tag in _ANSWER_TAG_RE.finditer(text):
        if not tag.group(1):
            opened = tag.end() if opened is None else opened
        elif opened is not None:
            last, opened = text[opened:tag.start()], None
    return last


def extract_answer(text: str) -> str | None:
    """The final answer of a response, or None when it gives none."""
    if not isinstance(text, str) or not text.strip():
        return None
    boxed = final_boxed(text)
    if boxed is not None:
        after = text[boxed[1]:]
        restated = _stated_answer(after) if "final answer" in after.lower() else None
        # a "Final Answer: ... 10,455" written after the boxes is the last word; "final answer." is not a value
        return restated if restated and re.search(r"[\d$\\]", restated) else boxed[0]
    if "<answer>" in text.lower():
        tagged = _last_tagged(text)
        if tagged is not None:
            inner = last_boxed(tagged)
            return (inner if inner is not None else tagged).strip()
    stated = _stated_answer(text)
    if stated:
        return stated
    if "####" in text:
        marked = _last_match(_GSM8K_RE, text)
        if marked:
            return marked
    stripped = text.strip()
    if len(stripped) <= SHORT_ANSWER_CHARS and "\n" not in stripped:
        return answer_in_sentence(stripped)
    return None
