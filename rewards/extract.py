"""Find the final answer in a model response (for users: docs/rewards.md, "Extraction").

Order: the last \\boxed{} / \\fbox{} (balanced braces), then the last
<answer>...</answer>, then "the (final) answer is ...", "Final Answer:",
"Answer:" (also markdown "**Answer:**", "**Final Answer**:"), GSM8K's "#### 42",
then a response opening with a choice letter ("A. Because ..."), then a short
response taken whole (a bare answer such as "(2,4)" or "3+2x"), then the value of
a finished response's concluding sentence ("... Therefore, x is 4."). A long
response with none of these has no answer: a number that appears only in the
working never counts. A blank box or tag pair is the prompt's "within
\\boxed{}" echoed back and is skipped. All scans are linear in the response's
length (math spans and <answer> tags are paired by hand: a lazy regex rescans the
rest of the text from every unclosed opener, and a lazy match tries its ending at
every character, so no ending may look an unbounded distance ahead), as the
default in-process path has no time limit.

Several boxes in the final sentence are read together: joined by "or" they are
a hedge (scored wrong), joined only by "and"/commas they are one list answer;
boxes in earlier sentences are revisions, and the last box wins. A "Final
Answer:" statement written after the last box is the response's last word.
Inside a tag, a box or a stated answer is the value ("<answer>The answer is 4</answer>" -> 4).
A stated answer that is a sentence ("The volume is 120", "$x \\ge 5$ is the
solution", "Therefore x = 3") is reduced to its value: what follows the last
"is" (or "=" when only a value follows), else its one math span; a closing remark
in words ("6 (not 5)") and a stated answer's closing "!" ("the answer is 42!") are
dropped; "x = 3 or x = 4" and "A = 5 and B = 6" stay whole.
"""

from __future__ import annotations

import re

SHORT_ANSWER_CHARS = 80  # a response this short with no marker is itself the answer
SHORT_STATEMENT_CHARS = 300  # one line this short ending "...: $v$" or "... is $v$" states v

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*(\{)|\\boxed +([^\s${}]+)")
_BRACE_RE = re.compile(r"(?<!\\)[{}]")
_ANSWER_TAG_RE = re.compile(r"<(/?)answer>", re.I)
# "Answer:", "The final answer is", markdown "**Answer:**" / "**Final Answer**:", or "Answer $9$" at a line start
_ANSWER_MARKER = (
    r"(?:(?:final answer|the answer|answer)\s*(?:\*+[ \t]*)?(?:is|:)(?:\*+(?=\s))?\s*(?::\s*)?"
    r"|^[ \t]*(?:final )?answer\s*(?=\$|\\[(\[]))"
)
_ANSWER_MARKER_RE = re.compile(_ANSWER_MARKER, re.I | re.M)
# The lazy value tries each ending at every character, so an ending may look only a bounded distance ahead
# ("\s*I hope" rescanned a whole run of spaces from each of its positions: quadratic). "!" before a capital
# ends the sentence ("42! So"), not "5! = 120"; a "!" at the end is stripped by _stated_answer.
_ANSWER_IS_RE = re.compile(
    _ANSWER_MARKER + r"(.+?)(?:\.\s|\.$|\n|$|I hope|![ \t]{1,8}(?=(?-i:[A-Z])))", re.I | re.M
)
_SENTENCE_END_RE = re.compile(r"[.!?](?:\s|$)|\n\s*\n")
_HEDGE_RE = re.compile(r"\bor\b", re.I)
_JOINER_RE = re.compile(r"\b(?:or|and)\b", re.I)
_AND_RE = re.compile(r"\band\b", re.I)
_REVISION_RE = re.compile(
    r"\b(?:not|no|nor|but|wait|actually|instead|rather|than|correct(?:ed|ion)?|wrong|mistake|sorry|oops|hmm|should|"
    r"change[ds]?|fix(?:ed)?|recheck|however|then)\b",
    re.I,
)
_LIST_JOINER_RE = re.compile(r"(?:\s|\$|\\[()\[\]]|[,;&]|\\q?quad\b|\\text\s*\{\s*and\s*\}|\band\b)*")
_MATH_OPENER_RE = re.compile(r"\$|\\[(\[]")
_MATH_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_PROSE_RE = re.compile(r"(?<![\\a-zA-Z])(?!(?:or|and)\b)[a-zA-Z]{2,}")  # "or"/"and" join values: no reduction
_COPULA_RE = re.compile(r"\s(?:is|are|was|equals|it's|that's)\s(?!not\b)", re.I)
_LEADS_TO_VALUE_RE = re.compile(r"(?:[:=]|\b(?:is|are|equals))\s*$", re.I)  # prose that hands over to the value
_EQUALS_RE = re.compile(r"(?<![<>!=:])=(?!=)")  # "=", not "<=", "==", ":="
# Between two "=": a list of values ("x = 1, x = 2"); between two words: "or"/"and" only ("2, since 3 is 3").
_EQUALS_JOINER_RE = re.compile(r"\b(?:or|and)\b|[,;]", re.I)
_MATH_IN_ASIDE_RE = re.compile(r"[()$\\^_{}=+*/<>]")
_WORD_RE = re.compile(r"[a-zA-Z]{3,}|[a-zA-Z]+\s+[a-zA-Z]+")  # "(not 5)", "(in cm)"; "(de)" is a product
_NON_BLANK_RE = re.compile(r"\S")
_QUOTED_RE = re.compile(r'^\\?"(.+?)\\?"$', re.S)  # also \" as a JSON or Python string writes it
_BOLD_RE = re.compile(r"^\*\*(.+)\*\*$", re.S)
_GSM8K_RE = re.compile(r"####\s*([^\n]+)")
# What a raw decode leaves after a finished turn ("<|im_start|>user", "<|eot_id|>", "</s>") and a closing formula
_END_OF_TURN_RE = re.compile(r"(?:\s*(?:<\|[a-z_]+\|>|</s>)(?:\s*(?:user|assistant|system)\b)?)+\s*$", re.I)
_CLOSING_FORMULA_RE = re.compile(r"\s*I hope (?:it|this) is correct[.!]?\s*$", re.I)
# A conclusion opens the sentence, or follows maths written without a full stop ("... = 6$ So, the pair is ...")
_CONCLUSION_RE = re.compile(
    r"(?:^|(?<=[$.!?:)\]])\s+)(?:Therefore|Thus|Hence|So|Consequently|In conclusion)\b,?\s*(?=\S)"
)
# "A. Because B is not valid", "(C) since ...": a multiple-choice response that opens with its letter
_CHOICE_FIRST_RE = re.compile(r"\(?([A-J])[.):]\s+[A-Za-z]")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} with balanced braces (or `\\boxed 5`)."""
    return next((text[first:last] for _, _, first, last in _boxes_from_last(text)), None)


def _boxes_from_last(text: str):
    """(start, end, content start, content end) of each well-formed box, the last one first. Linear: braces
    are matched once and contents are not copied (nested boxes would copy the text once per level)."""
    boxes = list(_BOX_RE.finditer(text))
    closing = _matching_braces(text) if boxes else {}
    for match in reversed(boxes):
        if match.group(2) is not None:
            yield match.start(), match.end(), *match.span(2)
        elif match.start(1) in closing:
            end = closing[match.start(1)]
            # an empty \boxed{} echoes the prompt's "within \boxed{}": not an answer
            if _NON_BLANK_RE.search(text, match.end(1), end):
                yield match.start(), end + 1, match.end(1), end


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each unescaped '{' -> index of its matching '}'; unbalanced ones are left out."""
    closing, stack = {}, []
    for brace in _BRACE_RE.finditer(text):
        if brace.group() == "{":
            stack.append(brace.start())
        elif stack:
            closing[stack.pop()] = brace.start()
    return closing


def final_boxed(text: str, or_is_list: bool = False) -> tuple[str, int] | None:
    """The boxed answer of the final sentence and where it ends: a hedge, a list, or the last box.
    ``or_is_list``: the text is a reference solution, whose boxes in the final sentence are all its answers:
    "$x = \\boxed{3}$ or $x = \\boxed{-3}$" names every answer (in a response "or" is a hedge)."""
    group: list[tuple[int, int, int, int]] = []  # boxes of the final sentence, last first
    for box in _boxes_from_last(text):
        if group and box[1] > group[-1][0]:  # encloses the box after it: "\\boxed{\\boxed{1}}" is 1
            continue
        if group and _SENTENCE_END_RE.search(text, box[1], group[-1][0]):
            break
        group.append(box)
    if not group:
        return None
    end = group[0][1]
    contents = list(dict.fromkeys(text[first:last].strip() for _, _, first, last in reversed(group)))
    if len(contents) == 1:
        return contents[0], end
    joiners = [text[later[1]:earlier[0]] for earlier, later in zip(group, group[1:])]
    hedged = any(_HEDGE_RE.search(joiner) for joiner in joiners)
    if hedged and not or_is_list:
        return " or ".join(contents), end  # "either 4 or 6": not a value, so it scores wrong
    # "\\boxed{-2} and \\boxed{1}", "\\boxed{(3,3)} for part (a) and \\boxed{(1,1)}": the answers together (in a
    # reference, boxes joined by anything but a revision: it names every answer)
    if hedged or all(_LIST_JOINER_RE.fullmatch(joiner) or _listing(joiner, or_is_list) for joiner in joiners):
        return ", ".join(contents), end
    return text[group[0][2]:group[0][3]].strip(), end  # a revision within the sentence


def _listing(joiner: str, reference: bool) -> bool:
    """Text between two boxes that lists them: no word of a revision ("and not", "but", "no"), and in a response
    an "and" ("for part (a) and"); a reference's boxes are listed by anything else ("papers and", "++++")."""
    return _REVISION_RE.search(joiner) is None and (reference or _AND_RE.search(joiner) is not None)


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


def _copulas_outside(
    sentence: str, spans: list[tuple[int, int, str]], pattern: re.Pattern
) -> tuple[re.Match, re.Match] | None:
    """The first and last ``pattern`` match outside the math spans (sorted: one pointer walks them)."""
    first = last = None
    span_index = 0
    for copula in pattern.finditer(sentence):
        while span_index < len(spans) and spans[span_index][1] <= copula.start():
            span_index += 1
        inside = span_index < len(spans) and spans[span_index][0] < copula.start()
        if not inside:
            first, last = first or copula, copula
    return (first, last) if last else None


def _without_aside(sentence: str) -> str:
    """'6 (not 5)' -> '6': a closing parenthetical in words is a remark on the value, not part of it."""
    sentence = sentence.strip()
    if not sentence.endswith(")"):
        return sentence
    opener = sentence.rfind("(")
    aside, value = sentence[opener + 1:-1], sentence[:opener].rstrip()
    # A remark stands apart after a blank and holds a word, no maths: "2(x^2 + xy)", "(2, 4)", "$f(x)$",
    # "\left(a, b\right)" and "4 \cdot (de)" are values.
    if opener > 0 and sentence[opener - 1].isspace() and not _MATH_IN_ASIDE_RE.search(aside) and _WORD_RE.search(aside):
        return value
    return sentence


def answer_in_sentence(sentence: str) -> str:
    """The value a sentence states: 'The volume of $V$ is 120' -> '120', '$x \\ge 5$ is the solution' -> 'x \\ge 5'."""
    sentence, spans = _unbolded(_without_aside(sentence))
    if not _has_prose(sentence, spans):
        return sentence
    # "is"/"are"/... first ("the function is f(x) = x^2 + 1"); "=" only in a sentence without one ("Therefore x = 3")
    copulas, joiner = _copulas_outside(sentence, spans, _COPULA_RE), _JOINER_RE
    if copulas is None:
        copulas, joiner = _copulas_outside(sentence, spans, _EQUALS_RE), _EQUALS_JOINER_RE
    if copulas is not None:
        first, copula = copulas
        # "x = 5 when y = 2": words between two "=" make them one condition, not a chain ending in the value
        if joiner is _EQUALS_JOINER_RE and _PROSE_RE.search(sentence, first.end(), copula.start()):
            return sentence
        joiners = list(joiner.finditer(sentence, first.end(), copula.start()))
        # "x = 3 or x = 4" (a hedge), "A = 5 and B = 6", "x = 1, x = 2" (lists): the last part alone is not the answer
        if joiners and not _PROSE_RE.search(sentence, joiners[-1].end(), copula.start()):
            return sentence
        tail, tail_spans = _unbolded(sentence[copula.end():])
        # "x = 3" ends in its value; "= 153. Put your final answer..." is working followed by more prose
        equation_with_prose = copula.group() == "=" and _has_prose(tail, tail_spans)
        # the tail's spans are the sentence's own, so it has no copula left to reduce: one step is final
        if re.search(r"[\d$\\]", tail) and not equation_with_prose:
            return tail_spans[0][2].strip() if len(tail_spans) == 1 and _has_prose(tail, tail_spans) else tail
    return spans[0][2].strip() if len(spans) == 1 else sentence


def _stated_answer(text: str) -> str | None:
    """The value after the last "the answer is" / "Final Answer:" / "Answer $...$", if any."""
    if "answer" not in text.lower():
        return None
    last = next(reversed(list(_ANSWER_IS_RE.finditer(text))), None)
    stated = last.group(1).strip() if last else None
    if last and text.startswith(("$$", "\\["), last.start(1)):
        # display maths over several lines ("Answer \\[ \n 9 \n \\]") is the value whole, not its first line
        # (inline $...$ and \\(...\\) stay on one line)
        spans = _math_spans(text[last.start(1):])
        if spans and spans[0][0] == 0 and spans[0][1] > last.end(1) - last.start(1):
            stated = text[last.start(1):last.start(1) + spans[0][1]].strip()
    if stated:
        # "Final Answer: The final answer is 28" -> the innermost statement: what follows its last marker
        inner = None
        for marker in _ANSWER_MARKER_RE.finditer(stated):
            if marker.end() < len(stated):
                inner = marker
        if inner is not None:
            stated = stated[inner.end():].strip()
    # a final "!" ends the sentence: "the answer is 42!" is 42 (a factorial is kept inside $5!$ or \boxed{5!});
    # quotes around the value are punctuation too: 'The final answer is "$12$ and $13$".'
    if not stated:
        return None
    value = answer_in_sentence(_QUOTED_RE.sub(r"\1", stated.rstrip(".!").strip()))
    return value if _parses(value) else _one_number(value) or value


def _parses(value: str) -> bool:
    """Does the value read as an answer ("14 miles" keeps its unit, so only a sentence is reduced to a number)?"""
    from .latex import ParseError, parse_answer

    try:
        parse_answer(value)
    except (ParseError, RecursionError):
        return False
    return True


_NUMBER_IN_WORDS_RE = re.compile(r"(?<![\w.,/^$\\])-?\d+(?:\.\d+)?%?(?![\w.,/^$%])")
_QUALIFIER_RE = re.compile(
    r"\b(?:or|not|no|nor|never|than|more|less|least|most|about|approximately|around|roughly|maybe|possibly|between|"
    r"from|to|until|except|up|over|under|below|above|nearly|almost)\b",
    re.I,
)


def _one_number(sentence: str) -> str | None:
    """'Jane started growing Sphere 3 hours ago' -> '3': a stated answer in words around one plain number and no
    maths. A qualifier ("at least 3", "3 or more", "not 3") or a second number keeps the sentence whole."""
    if _MATH_IN_ASIDE_RE.search(sentence) or _QUALIFIER_RE.search(sentence) or not _PROSE_RE.search(sentence):
        return None
    numbers = _NUMBER_IN_WORDS_RE.findall(sentence)
    # every digit of the sentence belongs to that one number (no "3rd", no digits glued to words)
    whole = len(numbers) == 1 and len(re.findall(r"\d", sentence)) == len(re.findall(r"\d", numbers[0]))
    return numbers[0] if whole else None


def concluding_answer(text: str) -> str | None:
    """'... Therefore, the probability that Alice wins is 2/3.' -> '2/3': the value of a finished response's last
    sentence when it opens with a conclusion (therefore, thus, hence, so, consequently, in conclusion) and states one
    value. Finished: it ends with a full stop (after any end-of-turn text and "I hope it is correct."), so a response
    cut off mid-sentence is not read; any earlier sentence is working and never counts."""
    body = _CLOSING_FORMULA_RE.sub("", _END_OF_TURN_RE.sub("", text)).rstrip()
    if not body.endswith((".", "!")):
        return None
    body = body[:-1]
    last_end = max((end.end() for end in _SENTENCE_END_RE.finditer(body)), default=0)
    sentence = body[max(last_end, body.rfind("\n") + 1):].strip()
    conclusion = max(_CONCLUSION_RE.finditer(sentence), key=lambda match: match.start(), default=None)
    if conclusion is None:
        return None
    value = answer_in_sentence(sentence[conclusion.end():])
    if not re.search(r"[\d$\\]", value):
        return None
    return _one_number(value) or (value if _parses(value) and not _has_prose(*_unbolded(value)) else None)


def _last_tagged(text: str) -> str | None:
    """Content of the last non-blank <answer>...</answer>, pairing each opener with the next closer (linear).

    A blank pair is the prompt's "inside <answer></answer> tags" echoed back, not an answer.
    """
    opened, last = None, None
    for tag in _ANSWER_TAG_RE.finditer(text):
        if not tag.group(1):
            opened = tag.end() if opened is None else opened
        elif opened is not None:
            if text[opened:tag.start()].strip():
                last = text[opened:tag.start()]
            opened = None
    return last


def tagged_answer(text: str) -> str | None:
    """The answer in the last <answer>...</answer>: its box, else the value it states ("The answer is 4"), else all."""
    if not isinstance(text, str) or "<answer>" not in text.lower():
        return None
    tagged = _last_tagged(text)
    if tagged is None:
        return None
    inner = last_boxed(tagged)
    if inner is not None:
        return inner.strip()
    return _stated_answer(tagged) or tagged.strip()


def extract_answer(text: str, reference: bool = False) -> str | None:
    """The final answer of a response, or None when it gives none. ``reference``: the text is a gold solution
    (its boxes in the final sentence are all answers, see final_boxed)."""
    if not isinstance(text, str) or not text.strip():
        return None
    boxed = final_boxed(text, or_is_list=reference)
    if boxed is not None:
        after = text[boxed[1]:]
        restated = _stated_answer(after) if "final answer" in after.lower() else None
        # a "Final Answer: ... 10,455" written after the boxes is the last word; "final answer." is not a value
        return restated if restated and re.search(r"[\d$\\]", restated) else boxed[0]
    tagged = tagged_answer(text)
    if tagged is not None:
        return tagged
    stated = _stated_answer(text)
    if stated:
        return stated
    if "####" in text:
        marked = _last_match(_GSM8K_RE, text)
        if marked:
            return marked
    stripped = text.strip()
    choice = _CHOICE_FIRST_RE.match(stripped)
    if choice:
        return choice.group(1)
    if "\n" not in stripped and len(stripped) <= SHORT_ANSWER_CHARS:
        return answer_in_sentence(stripped)
    concluded = concluding_answer(stripped)
    if concluded or "\n" in stripped:
        return concluded
    # one line that states one value at its end: "The sum is $...$", "Matrix with fractions: $...$"
    if len(stripped) <= SHORT_STATEMENT_CHARS:
        statement = stripped.rstrip(".").rstrip()
        spans = _math_spans(statement)
        if len(spans) == 1 and spans[0][1] == len(statement) and _LEADS_TO_VALUE_RE.search(statement, 0, spans[0][0]):
            return spans[0][2].strip()
    return None
