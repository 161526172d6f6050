"""Parse a short math answer (bare LaTeX or plain text) into a small tree we control.

No `eval`, no `sympify`: a tokenizer and a recursive-descent parser build tuples
that `compare.py` checks exactly (fractions) and `symbolic.py` turns into sympy
only inside the time-limited worker. Every loop here is linear in the input,
inputs are size-guarded and a \\pm value expands to at most MAX_PLUS_MINUS_VALUES
values, so parsing and every walk over a tree are bounded in time.

Node shapes (all tuples, hashable):
  ("num", Fraction, places)     places = decimals written, or None for an integer/fraction
  ("sym", name) ("const", "pi"|"e"|"i"|"inf") ("text", words)
  ("add", terms) ("mul", factors) ("div", a, b) ("neg", a) ("pow", base, exp)
  ("fn", name, args) ("pct", a)
  ("tuple", items) ("set", items) ("interval", lo_closed, lo, hi, hi_closed) ("union", items)
  ("matrix", rows) ("eq", lhs, rhs) ("rel", op, lhs, rhs)   op in "<", "<=", "!="
  ("chain", links)              links are eq/rel nodes: "1 < x <= 2", "a = b < c"
  ("ratio", parts)              "7:32", "S_1:S_2": compared part by part, like a tuple
A value with \\pm in it is the set of its values (see _expand_plus_minus).
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

MAX_ANSWER_CHARS = 1000  # longer "answers" are compared as strings only
MAX_DEPTH = 60  # parser recursion bound (deep braces)


class ParseError(ValueError):
    """The answer is not in the grammar; callers fall back to string comparison."""


_UNICODE = {
    "\u2212": "-", "\u2013": "-", "\u00d7": r"\times ", "\u00f7": "/", "\u00b7": r"\cdot ", "\u03c0": r"\pi ",
    "\u221e": r"\infty ", "\u221a": r"\sqrt ", "\u2264": r"\le ", "\u2265": r"\ge ", "\u2260": r"\ne ",
    "\u20ac": "", "\u00a3": "", "\u00a5": "",  # currency signs, dropped like $
    "\u00b0": r"^\circ", "\u00b2": "^2", "\u00b3": "^3", "\u00a0": " ", "\u00b1": r"\pm ", "\u222a": r"\cup ",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))

# Spacing, sizing and style commands that never change the value.
_DROP_RE = re.compile(
    r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg|displaystyle|textstyle|limits)(?![a-zA-Z])"
    r"|(?<!\\)\\[!,;:> ]|\\q?quad|\\(?:hspace|vspace)\*?\{[^{}]*\}|~"
)
_DEGREES_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|\s*degrees?\b")
# "\\\\frac", "\\\\le": a command escaped twice (text copied out of a JSON or Python string), not a line break
_DOUBLE_ESCAPED_RE = re.compile(
    r"(?<!\\)\\(?=\\(?:[dtc]?frac|sqrt|left|right|le|leq|ge|geq|ne|neq|pi|infty|cdot|times|pm|in|cup|text|mathrm|boxed)"
    r"(?![a-zA-Z]))"
)
# \lvert x \rvert and \vert x \vert are |x|; \mathbb{R}, the real numbers, is the interval it names
_ABS_BAR_RE = re.compile(r"\\[lr]?vert(?![a-zA-Z])")
_REALS_RE = re.compile(r"\\mathbb\s*(?:\{\s*R\s*\}|R(?![a-zA-Z]))")
# An approximation written after an exact value is a remark on it ("x = 1/3 \\approx 0.33"); alone it states the value.
_TRAILING_APPROX_RE = re.compile(r"(=[^,;=]*?)\s*\\approx[^,;=]*")
_FRAC_SPELLINGS_RE = re.compile(r"\\[dtc]frac(?![a-zA-Z])")
_STYLE_CMDS = (
    "text", "textbf", "textit", "textrm", "textnormal", "mathrm", "mathbf", "mathit", "mbox", "operatorname", "boxed", "fbox"
)
_STYLE_RE = re.compile(r"\\(" + "|".join(_STYLE_CMDS) + r")\s*\{")
_UNITS = (
    "cm|mm|km|m|kg|mg|g|s|sec|seconds?|minutes?|min|hours?|hrs?|h|days?|weeks?|years?|ml|mL|l|L|"
    "inch(?:es)?|in|feet|foot|ft|yards?|yd|miles?|mi|mph|meters?|metres?|centimeters?|kilometers?|grams?|"
    "kilograms?|pounds?|lbs?|ounces?|oz|dollars?|cents?|units?|sq|square|cubic|cm\\^2|m\\^2|cm\\^3|m\\^3|"
    "degrees?|radians?|rad|people|students|apples|marbles|points|times|ways|liters?|litres?|gallons?"
)
_UNIT_TAIL_RE = re.compile(r"^(.*?[\d}.])\s*((?:(?:square|cubic|sq)\s+)?(?:" + _UNITS + r")(?:\s*\^\s*\{?[23]\}?)?)$")
_MIXED_PLAIN_RE = re.compile(r"^([+-]?)(\d{1,3}(?: \d{3})+|\d+)\s+(\d+)\s*/\s*(\d+)$")  # also 1 000 4/9
_MIXED_LATEX_RE = re.compile(r"^([+-]?)(\d+)\s*\\frac\s*\{?\s*(\d+)\s*\}?\s*\{?\s*(\d+)\s*\}?$")
_SPACED_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?: \d{3})+(?:\.\d+)?$")
_BRACED_COMMA_RE = re.compile(r"(?<=\d)\s*\{\s*,\s*\}\s*(?=\d)|\{,\}")  # 14{,}916 and 14 {, }916: a thousands comma
_NUMBER_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])")
_BRACKET_OR_THOUSANDS_RE = re.compile(r"(\\\{|[(\[])|(\\\}|[)\]])|" + _THOUSANDS_RE.pattern)
_LATEX_THOUSANDS_RE = re.compile(r"(?<=\d),\s*\\!\s*(?=\d{3})")  # MATH writes 1,\!000 and 11,\! 111
# E-notation is read as scientific notation only where that is the one sensible reading (see _sci_to_pow).
_E_NOTATION_RE = re.compile(r"(?<![\w.\\^])(\d+\.\d*|\.\d+|\d+)[eE]([+-]?)(\d{1,4})(?![\w.^])")
_TIMES_TEN_RE = re.compile(r"(?<=[\d.])\s*(?:\\times|\*|x)\s*10\s*\^\s*\{?\s*([+-]?\d{1,4})\s*\}?")
_WORD_RE = re.compile(r"[a-zA-Z]+")
# Short English answer words, read as text (any case) rather than as products of one-letter variables:
# otherwise "Yes" (Y*e*s) differs from "yes" and "no" (n*o) equals "on". Longer words are text anyway.
_ANSWER_WORDS = {"yes", "no", "odd", "all", "not", "nil", "one", "two", "six", "ten"}
# A whole answer of 2-3 letters with a capital, like ABD or BCA, names points or choices, not a product
# (ADB is not ABD); it is compared as written. Lowercase xy, ab, abc stay products of variables.
_LABEL_RE = re.compile(r"[A-Za-z]{2,3}")

_FUNCTIONS = {
    "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "log", "ln", "exp", "lg",
}
# Functions of a bracketed list: \max(a, b), \min\{a, b\}, \gcd(a, b), \operatorname{lcm}(a, b)
_LIST_FUNCTIONS = {"max", "min", "gcd", "lcm"}
_LIST_OPENER_RE = re.compile(r"\s*(?:\(|\\\{)")  # the list's bracket, after any spaces
# \operatorname{lcm}(, \mathrm{gcd}\{ ...: the function itself; "5 \text{min}" with no bracket after it stays a unit
_NAMED_LIST_FUNCTION_RE = re.compile(
    r"\\(?:operatorname|mathrm|textrm|text)\s*\{\s*(" + "|".join(sorted(_LIST_FUNCTIONS)) + r")\s*\}"
    r"(?=" + _LIST_OPENER_RE.pattern + ")"
)
_FLOOR_CEILING = {r"\lfloor": (r"\rfloor", "floor"), r"\lceil": (r"\rceil", "ceil")}  # opener: (closer, function)
# f^{-1}: the inverse function where the notation means it (sin^{-1} x = arcsin x); None where it is read both ways
_INVERSE_NOTATION = {"sin": "arcsin", "cos": "arccos", "tan": "arctan", "cot": None, "sec": None, "csc": None,
                     "sinh": None, "cosh": None, "tanh": None}
_CONSTANT_CMDS = {"pi": ("const", "pi"), "infty": ("const", "inf"), "infinity": ("const", "inf"), "inf": ("const", "inf")}
_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta", "iota",
    "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon", "phi", "varphi", "chi", "psi", "omega",
    "Gamma", "Delta", "Theta", "Lambda", "Xi", "Sigma", "Phi", "Psi", "Omega",
}
_RELATIONS = {
    "=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "!=": "!=", r"\le": "<=", r"\leq": "<=",
    r"\leqslant": "<=", r"\ge": ">=", r"\geq": ">=", r"\geqslant": ">=", r"\ne": "!=", r"\neq": "!=", r"\lt": "<",
    r"\gt": ">",
}


def _brace_group(s: str, open_index: int) -> int:
    """Index just past the brace group opening at s[open_index] == '{'; -1 if unbalanced."""
    depth = 0
    for i in range(open_index, len(s)):
        ch = s[i]
        if ch == "\\":
            continue
        if ch == "{" and (i == 0 or s[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and (i == 0 or s[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _unwrap_style_commands(s: str) -> str:
    """Replace \\text{X}, \\mathrm{X}, \\boxed{X}, ... by X (their braces kept as a group)."""
    out, pos = [], 0
    for _ in range(len(s)):
        match = _STYLE_RE.search(s, pos)
        if not match:
            break
        end = _brace_group(s, match.end() - 1)
        if end < 0:
            break
        out.append(s[pos:match.start()])
        inner = s[match.end():end - 1]
        # text words keep a space around them so "5\text{cm}" reads as "5 cm"
        out.append(" " + inner + " " if match.group(1).startswith(("text", "mbox", "mathrm")) else "{" + inner + "}")
        pos = end
    out.append(s[pos:])
    return "".join(out)


@lru_cache(maxsize=8192)  # pure; the gold of a group and short answers recur across a batch
def normalize(answer: str) -> str:
    """Canonical string form of an answer, the first and cheapest equality test: maths delimiters, sizing and
    spacing commands, \\text{}-style wrappers and degree marks dropped; fraction spellings, thousands separators,
    percent and unicode symbols written one way."""
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], answer).strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        while len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left):len(s) - len(right)].strip()
    s = _DOUBLE_ESCAPED_RE.sub("", s)
    s = _DROP_RE.sub(" ", _LATEX_THOUSANDS_RE.sub(",", s))
    s = _REALS_RE.sub(r"(-\\infty,\\infty)", _ABS_BAR_RE.sub("|", s))
    s = _TRAILING_APPROX_RE.sub(r"\1", s).replace(r"\approx", "=")
    s = _FRAC_SPELLINGS_RE.sub(r"\\frac", s).replace(r"\dbinom", r"\binom").replace(r"\tbinom", r"\binom")
    s = _DEGREES_RE.sub("", s)
    s = _unwrap_style_commands(_NAMED_LIST_FUNCTION_RE.sub(r"\\\1", s))
    s = _BRACED_COMMA_RE.sub(",", s).replace(r"\$", "").replace("$", "").replace(r"\%", "%")
    s = re.sub(r"\s*(?:percent(?:age)?|pct)\b", "%", s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".,;").strip()  # sentence punctuation after the answer
    s = re.sub(r"^[a-zA-Z]\s*\\in\s*", "", s)  # "x \in [2,5)" -> "[2,5)"
    return s


def split_unit(s: str) -> tuple[str, str | None]:
    """'5 cm' -> ('5', 'cm'); the unit is compared separately so '5 m' never equals '5 cm'."""
    match = _UNIT_TAIL_RE.match(s)
    if not match or not _NUMBER_RE.search(match.group(1)):
        return s, None
    return match.group(1).strip(), _singular(re.sub(r"\s+|[{}]", "", match.group(2)))


def _singular(unit: str) -> str:
    """'inches' -> 'inch', 'cookies' -> 'cooki': plural words compare equal to their singular (short units kept)."""
    return re.sub(r"(es|s)$", "", unit) if len(unit) > 3 else unit


# ---------------------------------------------------------------- tokenizer
_TOKEN_RE = re.compile(
    r"(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"|(?P<cmd>\\[a-zA-Z]+|\\\{|\\\}|\\\\|\\\|)"
    r"|(?P<word>[a-zA-Z]+)"
    r"|(?P<op><=|>=|!=|[-+*/^_=<>(),\[\]{}|!&;:%'])"
    r"|(?P<space>\s+)"
)


def tokenize(s: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(s):
        match = _TOKEN_RE.match(s, pos)
        if not match:
            raise ParseError(f"unexpected character {s[pos]!r} at {pos}")
        kind = match.lastgroup
        if kind == "word":
            # plain words: a known function, a constant, or single-letter variables multiplied
            word = match.group()
            if len(tokens) >= 2 and tokens[-1][1] == "{" and tokens[-2][1] in (r"\begin", r"\end"):
                tokens.append(("env", word))
            elif len(tokens) >= 2 and tokens[-1][1] == "{" and tokens[-2][1] in ("_", "^", r"\frac") and word.isupper():
                tokens.extend(("word", ch) for ch in word)  # points, not words: S_{MBCN}, \frac{NO}{BO}
            elif word in ("or", "and"):
                tokens.append(("text", word))  # hedged answers ("3 or 4") are not values
            elif word in _LIST_FUNCTIONS and _LIST_OPENER_RE.match(s, match.end()):
                tokens.append(("cmd", "\\" + word))  # max(1, 2) as \max(1, 2); "5 min" stays a unit
            elif word in _FUNCTIONS or word in ("sqrt", "pi", "inf", "infinity", "oo"):
                tokens.append(("cmd", "\\" + ("infty" if word in ("inf", "infinity", "oo") else word)))
            elif len(word) > 3 and word.lower() not in _FUNCTIONS or word.lower() in _ANSWER_WORDS:
                tokens.append(("text", word))
            else:
                tokens.extend(("word", ch) for ch in word)
        elif kind != "space":
            tokens.append((kind, match.group()))
        pos = match.end()
    return tokens


# ---------------------------------------------------------------- parser
def _num(value: Fraction, places: int | None = None) -> tuple:
    return ("num", value, places)


def _number_token(text: str) -> tuple:
    if "." in text:
        whole, _, frac = text.partition(".")
        return _num(Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac)), len(frac))
    return _num(Fraction(int(text)))


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self, offset: int = 0) -> tuple[str, str]:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else ("eof", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.pos += 1
        return token

    def expect(self, value: str) -> None:
        token = self.take()
        if token[1] != value:
            raise ParseError(f"expected {value!r}, got {token[1]!r}")

    def at(self, *values: str) -> bool:
        return self.peek()[1] in values

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("nesting too deep")

    # relation := ratio (relop ratio)*
    def relation(self) -> tuple:
        self.enter()
        left = self.ratio()
        chain = []
        while self.peek()[1] in _RELATIONS:
            op = _RELATIONS[self.take()[1]]
            right = self.ratio()
            chain.append((op, left, right))
            left = right
        self.depth -= 1
        if not chain:
            return left
        if len(chain) == 1:
            return _relation(*chain[0])
        if all(op == "=" for op, _, _ in chain):
            # worked equalities "x = 5+5+1 = 11" state their result: the first member equals the last
            return ("eq", chain[0][1], chain[-1][2])
        return ("chain", tuple(_relation(*link) for link in chain))

    # ratio := additive (":" additive)*
    def ratio(self) -> tuple:
        parts = [self.additive()]
        while self.at(":"):
            self.take()
            parts.append(self.additive())
        return parts[0] if len(parts) == 1 else ("ratio", tuple(parts))

    def additive(self) -> tuple:
        terms = [self.term()]
        pm = None
        while self.at("+", "-", r"\pm", r"\mp"):
            op = self.take()[1]
            right = self.term()
            if op in (r"\pm", r"\mp"):
                if pm is not None:
                    raise ParseError("more than one \\pm")
                pm = (_flat("add", terms), right)
                terms = [("num", Fraction(0), None)]
                continue
            terms.append(right if op == "+" else ("neg", right))
        rest = _flat("add", terms)
        if pm is None:
            return rest
        base, offset = pm
        base = _flat("add", [base, rest]) if rest != ("num", Fraction(0), None) else base
        return ("pm", base, offset)

    def term(self) -> tuple:
        factors = [self.unary()]
        while True:
            kind, value = self.peek()
            if value in ("*", r"\cdot", r"\times"):
                self.take()
                factors.append(self.unary())
            elif value in ("/", r"\div"):
                self.take()
                factors = [("div", _flat("mul", factors), self.unary())]
            elif value == "%":
                self.take()
                factors = [("pct", _flat("mul", factors))]
            elif kind == "num" and factors[-1][0] == "num":
                # "3 4" is two answers (or digits split by a space), never 12; LaTeX would even print 34
                raise ParseError("two numbers side by side")
            elif self._starts_atom(kind, value):
                factors.append(self.power())  # implicit multiplication: 2x, 3\sqrt{2}, (a)(b)
            else:
                return _flat("mul", factors)

    def function_argument(self) -> tuple:
        """A function's argument written without brackets: the implicit product that follows, as written maths and
        math-verify read it (\\cos 2x is cos(2x), \\sin \\pi x is sin(pi x)), up to an operator, a bracket, a second
        number or another function (\\sin x \\cos x is sin(x) cos(x))."""
        factors = [self.power()]
        while True:
            kind, value = self.peek()
            another_number = kind == "num" and factors[-1][0] == "num"  # "\sin 2 3" is sin(2)·3, as before
            function = kind == "cmd" and value[1:] in (*_FUNCTIONS, *_LIST_FUNCTIONS, "sum", "prod")
            if another_number or function or value in ("(", "[", "{") or not self._starts_atom(kind, value):
                return _flat("mul", factors)
            factors.append(self.power())

    @staticmethod
    def _starts_atom(kind: str, value: str) -> bool:
        if kind in ("num", "word"):
            return True
        if kind == "cmd":
            return value not in _RELATIONS and value not in (
                r"\pm", r"\mp", r"\cdot", r"\times", r"\div", r"\cup", r"\cap", "\\\\", r"\}", r"\to", r"\implies",
                r"\quad", r"\text", r"\end", r"\rfloor", r"\rceil",
            )
        return value in ("(", "{", "[", "|") and value != "|"

    def unary(self) -> tuple:
        if not self.at("-", "+", r"\pm", r"\mp"):
            return self.power()
        sign = self.take()[1]
        # Signs nest without brackets ("- - - x", "\pm 2 \cdot \pm 2 ..."): they count toward MAX_DEPTH, so that 500
        # minus signs are a ParseError rather than a RecursionError later. A lone "-(" costs no level of its own.
        nests = sign in (r"\pm", r"\mp") or self.at("-", "+", r"\pm", r"\mp")
        if nests:
            self.enter()
        if sign == "-":
            node = ("neg", self.unary())
        elif sign == "+":
            node = self.unary()
        else:
            node = ("pm", None, self.term())  # "\pm 3" is the pair {3, -3}
        if nests:
            self.depth -= 1
        return node

    def power(self) -> tuple:
        self.enter()
        base = self.postfix()
        if self.at("^"):
            self.take()
            exponent = self.unary() if self.at("-", "+") else self.postfix()
            base = ("pow", base, exponent)
        self.depth -= 1
        return base

    def postfix(self) -> tuple:
        node = self.atom()
        while self.at("!", "'"):
            if self.take()[1] == "'":
                raise ParseError("primes are not values")
            node = ("fn", "factorial", (node,))
        return node

    def group(self) -> tuple:
        """A braced argument {..} or a single token (\\frac12, \\sqrt3, x^2)."""
        if self.at("{"):
            self.take()
            inner = self.relation()
            self.expect("}")
            return inner
        kind, value = self.take()
        if kind == "num":
            # \frac12 means 1/2: a single-digit argument
            if len(value) > 1 and "." not in value:
                self.tokens.insert(self.pos, ("num", value[1:]))
                value = value[0]
            return _number_token(value)
        if kind == "word":
            return ("sym", value)
        if kind == "cmd":
            self.pos -= 1
            return self.atom()
        raise ParseError(f"expected an argument, got {value!r}")

    def atom(self) -> tuple:
        self.enter()
        kind, value = self.take()
        self.depth -= 1
        if kind == "num":
            node = _number_token(value)
            if self.at("_"):
                raise ParseError("subscripted number")
            return node
        if kind == "word":
            if self.at("_"):
                self.take()
                sub = self.group()
                return ("sym", value + "_" + _plain(sub))
            if value in ("e", "i") and not self.at("("):
                return ("const", value)
            return ("sym", value)
        if kind == "text":
            raise ParseError(f"word {value!r}")
        if value in ("(", "["):
            return self.bracketed(value)
        if value == "{":  # a group, or a set written with bare braces: {-2021, 2021}
            items = self.items("}")
            if not items:
                raise ParseError("empty group")
            return items[0] if len(items) == 1 else ("set", tuple(items))
        if value == "|":
            inner = self.additive()
            self.expect("|")
            return ("fn", "abs", (inner,))
        if value == r"\{":
            items = self.items(r"\}")
            return ("set", tuple(items))
        if value in _FLOOR_CEILING:
            inner = self.additive()
            closer, name = _FLOOR_CEILING[value]
            self.expect(closer)
            return ("fn", name, (inner,))
        if kind == "cmd":
            return self.command(value)
        raise ParseError(f"unexpected {value!r}")

    def items(self, closer: str) -> list[tuple]:
        items = [] if self.at(closer) else [self.relation()]
        while self.at(",", ";"):
            self.take()
            items.append(self.relation())
        self.expect(closer)
        return items

    def bracketed(self, opener: str) -> tuple:
        items = [self.relation()]
        while self.at(",", ";"):
            self.take()
            items.append(self.relation())
        closer = self.take()[1]
        if closer not in (")", "]"):
            raise ParseError(f"unclosed {opener!r}")
        if len(items) == 1:
            if opener == "(" and closer == ")" or opener == "[" and closer == "]":
                return items[0]
            raise ParseError("half-open bracket around one value")
        if len(items) == 2 and (opener, closer) != ("(", ")"):
            return ("interval", opener == "[", items[0], items[1], closer == "]")
        if opener == "(" and closer == ")":
            return ("tuple", tuple(items))  # (a, b) is also the open interval; compare.py knows
        if opener == "[" and closer == "]":
            return ("tuple", tuple(items))
        raise ParseError("mismatched brackets")

    def command(self, name: str) -> tuple:
        bare = name[1:]
        if bare in _CONSTANT_CMDS:
            return _CONSTANT_CMDS[bare]
        if bare == "frac":
            return ("div", self.group(), self.group())
        if bare in ("sum", "prod"):
            return self.big_operator(bare)
        if bare == "binom":
            return ("fn", "binom", (self.group(), self.group()))
        if bare == "sqrt":
            index = None
            if self.at("["):
                self.take()
                index = self.additive()
                self.expect("]")
            arg = self.group()
            return ("pow", arg, ("div", _num(Fraction(1)), index)) if index is not None else ("fn", "sqrt", (arg,))
        if bare in _FUNCTIONS:
            base = None
            if bare == "log" and self.at("_"):
                self.take()
                base = self.group()
            exponent = None
            if self.at("^"):
                self.take()
                exponent = self.group()
            if exponent == ("neg", _num(Fraction(1))) and bare in _INVERSE_NOTATION:
                # \sin^{-1} x is arcsin x, not 1/sin x; for the others the notation is read both ways
                if _INVERSE_NOTATION[bare] is None:
                    raise ParseError(f"\\{bare}^{{-1}}: an inverse or a reciprocal")
                bare, exponent = _INVERSE_NOTATION[bare], None
            arg = self.atom() if self.at("(") else self.function_argument()
            node = ("fn", bare, (arg,) if base is None else (arg, base))
            return ("pow", node, exponent) if exponent is not None else node
        if bare in _LIST_FUNCTIONS:
            return self.list_function(bare)
        if bare in _GREEK:
            return ("sym", bare)
        if bare == "begin":
            return self.matrix()
        if bare in ("emptyset", "varnothing"):
            return ("set", ())
        raise ParseError(f"unsupported command {name}")

    def list_function(self, name: str) -> tuple:
        """\\max(a, b, c) or \\max\\{a, b, c\\} -> ("fn", "max", (a, b, c)); a subscript (\\max_{x}) or a bare argument
        is refused rather than guessed."""
        if not self.at("(", r"\{"):
            raise ParseError(f"\\{name} without its arguments in brackets")
        args = self.items(")" if self.take()[1] == "(" else r"\}")
        if not args:
            raise ParseError(f"\\{name} of nothing")
        return ("fn", name, tuple(args))

    def big_operator(self, name: str) -> tuple:
        """\\sum_{k=0}^{n-1} F_k F_{n-k-1} -> ("fn", "sum", (body, k, 0, n-1)); the body is the product that follows."""
        self.expect("_")
        bound = self.group()
        self.expect("^")
        upper = self.group()
        if bound[0] != "eq" or bound[1][0] != "sym":
            raise ParseError(f"\\{name} without an index")
        self.enter()
        body = self.term()
        self.depth -= 1
        return ("fn", name, (body, bound[1], bound[2], upper))

    def matrix(self) -> tuple:
        self.expect("{")
        env = self.take()[1]
        self.expect("}")
        if env not in ("pmatrix", "bmatrix", "matrix", "Bmatrix", "smallmatrix", "array"):
            raise ParseError(f"environment {env!r}")
        if env == "array" and self.at("{"):  # column spec
            while not self.at("}", ""):
                self.take()
            self.expect("}")
        rows, row = [], [self.additive()]
        while True:
            value = self.take()[1]
            if value == "&":
                row.append(self.additive())
            elif value == "\\\\":
                rows.append(tuple(row))
                if self.at(r"\end"):
                    row = []
                    continue
                row = [self.additive()]
            elif value == r"\end":
                if row:
                    rows.append(tuple(row))
                self.expect("{")
                self.take()
                self.expect("}")
                break
            else:
                raise ParseError(f"unexpected {value!r} in matrix")
        if len({len(r) for r in rows}) != 1:
            raise ParseError("ragged matrix")
        return ("matrix", tuple(rows))


def _relation(op: str, left: tuple, right: tuple) -> tuple:
    if op == "=":
        return ("eq", left, right)
    if op in (">", ">="):
        return ("rel", "<" if op == ">" else "<=", right, left)
    return ("rel", op, left, right)


def _flat(kind: str, parts: list[tuple]) -> tuple:
    """n-ary add/mul, flattened so a+(b+c) and (a+b)+c get the same shape."""
    if len(parts) == 1:
        return parts[0]
    flat: list[tuple] = []
    for part in parts:
        flat.extend(part[1] if part[0] == kind else (part,))
    return (kind, tuple(flat))


def _plain(node: tuple) -> str:
    if node[0] == "num":
        return str(node[1])
    if node[0] in ("sym", "const"):
        return node[1]
    if node[0] == "mul" and all(part[0] in ("sym", "num") for part in node[1]):  # S_{MBCN}, a_{12k}
        return "".join(_plain(part) for part in node[1])
    if node[0] in ("add", "neg", "mul", "div", "pow", "fn"):  # F_{n-k-1}: named by its canonical form (F_{n-1-k} alike)
        from .compare import canonical

        return "{" + repr(canonical(node)) + "}"
    raise ParseError("complex subscript")


def _join_top_level_commas(s: str) -> str:
    """'1,234,567' -> '1234567': groups of exactly three digits, outside brackets ('(12,102)' is a pair)."""
    depth = 0

    def join(match: re.Match) -> str:
        nonlocal depth
        if match.group(1):
            depth += 1
        elif match.group(2):
            depth = max(depth - 1, 0)
        elif depth == 0:
            return match.group(0).replace(",", "")
        return match.group(0)

    return _BRACKET_OR_THOUSANDS_RE.sub(join, s)


@lru_cache(maxsize=4096)
def parse_answer(answer: str) -> tuple:
    """Tree of one answer; raises ParseError outside the grammar. Cached: gold answers repeat."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise ParseError(f"answer longer than {MAX_ANSWER_CHARS} characters")
    s = normalize(answer)
    if not s:
        raise ParseError("empty answer")
    value, unit = split_unit(s)
    if unit and len(unit) == 1 and not _PLAIN_NUMBER_RE.fullmatch(value) and not _written_as_text_unit(answer, unit):
        # a bare one-letter "unit" after an expression is a variable: \pi r^2 h, \sqrt{2} m, 2^3 g
        # ('4 s' and '\sqrt{2}\text{ m}' keep their unit)
        value, unit = s, None
    if unit is None:
        tail = _text_word_tail(answer, s)
        if tail is not None:
            return tail
    node = _parse_value(value)
    return ("unit", node, unit) if unit else node


_WORD_TAIL_RE = re.compile(r"^(.*?\S)\s+([A-Za-z]+(?: [A-Za-z]+)?)$")
# words that make a tail a hedge or a condition, not a unit: "12 \text{ or more}", "3 \text{ is not}"
_TAIL_STOP_WORDS = {
    "or", "and", "not", "no", "nor", "never", "none", "but", "except", "than", "more", "less", "least", "most",
    "at", "only", "if", "is", "are", "was", "approximately", "about", "roughly", "maybe", "possibly",
}


def _text_word_tail(answer: str, s: str) -> tuple | None:
    """'12 \\text{ cookies}' -> ('unit', 12, 'cooki'): a number followed by a \\text{} noun outside the unit list.

    Only a plain number (or a fraction of numbers) and one or two letter-only words written inside \\text{}
    (or \\mathrm{}, \\mbox{}) qualify; the words are a unit, so they only matter against a gold unit.
    """
    match = _WORD_TAIL_RE.match(s)
    if not match:
        return None
    value, words = match.group(1), match.group(2)
    if any(word.lower() in _TAIL_STOP_WORDS for word in words.split()):
        return None
    if not _written_as_text_unit(answer, words):
        return None
    try:
        node = _parse_value(value)
    except ParseError:
        return None
    if not _is_number_tree(node):
        return None
    return ("unit", node, _singular(words.replace(" ", "").lower()))


def _is_number_tree(node: tuple) -> bool:
    """A number, a negated number or a fraction of numbers: 12, -3, 1.5, \\frac{3}{4}."""
    if node[0] == "num":
        return True
    if node[0] == "neg":
        return _is_number_tree(node[1])
    return node[0] == "div" and _is_number_tree(node[1]) and _is_number_tree(node[2])


_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)")


def _written_as_text_unit(answer: str, unit: str) -> bool:
    """Did the raw answer write this unit (one or more words) inside \\text{}, \\mathrm{} (or \\mbox, \\textrm, ...)?"""
    words = r"\s+".join(map(re.escape, unit.split()))
    return re.search(r"\\(?:text[a-z]*|mathrm|mbox)\s*\{\s*" + words + r"\s*\}", answer) is not None


def _parse_value(s: str) -> tuple:
    tree = _parse_tree(s)
    return _expand_plus_minus(tree) if "\\pm" in s or "\\mp" in s else tree  # most answers have no \pm


def _parse_tree(s: str) -> tuple:
    """Tree of a value, with internal ("pm", base, offset) nodes for \\pm (base None for a leading \\pm)."""
    if s.endswith("%") and len(s) > 1:  # applies to the whole value: "4 4/9%" is (40/9)%
        return ("pct", _parse_tree(s[:-1].rstrip()))
    mixed = _MIXED_PLAIN_RE.match(s) or _MIXED_LATEX_RE.match(s)
    if mixed and int(mixed.group(3)) < int(mixed.group(4)):
        sign, whole, num, den = mixed.groups()
        value = int(whole.replace(" ", "")) + Fraction(int(num), int(den))
        return _num(-value if sign == "-" else value)
    if _SPACED_THOUSANDS_RE.match(s):
        s = s.replace(" ", "")
    if _LABEL_RE.fullmatch(s) and not s.islower() and s.lower() not in _ANSWER_WORDS:
        return ("text", s)  # a label such as ABD, case and order kept
    s = _sci_to_pow(s)
    s = _join_top_level_commas(s)
    tokens = _and_as_comma(tokenize(s))
    if any(kind == "text" for kind, _ in tokens):
        if all(kind in ("text", "word") for kind, _ in tokens):
            return ("text", " ".join(v for _, v in tokens).lower())
        raise ParseError("words mixed with math")
    parser = _Parser(tokens)
    items = [parser.relation()]
    union, separators = [], []
    while parser.at(",", ";", r"\cup"):
        sep = parser.take()[1]
        (union if sep == r"\cup" else items).append(parser.relation())
        if sep != r"\cup":
            separators.append(sep)
    if parser.peek()[0] != "eof":
        raise ParseError(f"trailing {parser.peek()[1]!r}")
    if union:
        if len(items) != 1:
            raise ParseError("union mixed with a list")
        return ("union", tuple([items[0], *union]))
    if ";" in separators and "," in separators:
        solutions = _solutions(items, separators)
        if solutions is not None:
            return solutions
    # a bare comma list is the MATH convention for "all answers, any order"
    return items[0] if len(items) == 1 else ("set", tuple(items))


def _solutions(items: list[tuple], separators: list[str]) -> tuple | None:
    """'p=5,q=2;p=7,q=2' -> {(5, 2), (7, 2)}: solutions separated by ';', each giving the same variables in order."""
    groups: list[list[tuple]] = [[items[0]]]
    for sep, item in zip(separators, items[1:]):
        if sep == ";":
            groups.append([])
        groups[-1].append(item)
    names = [tuple(item[1] if item[0] == "eq" else None for item in group) for group in groups]
    if len(set(names)) != 1 or len(names[0]) < 2 or len(set(names[0])) != len(names[0]):
        return None
    if any(name is None or name[0] != "sym" for name in names[0]):
        return None
    return ("set", tuple(("tuple", tuple(item[2] for item in group)) for group in groups))


def _and_as_comma(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """'12 and 13', '19, 46, and 82' -> a comma list, when "and" is the only word and stands between values
    (so "3 or 4", a hedge, and words like "no solution" stay text)."""
    words = [i for i, (kind, _) in enumerate(tokens) if kind == "text"]
    if not words or any(tokens[i][1] != "and" for i in words) or words[0] == 0 or words[-1] == len(tokens) - 1:
        return tokens
    joined: list[tuple[str, str]] = []
    for kind, value in tokens:
        if kind != "text":
            joined.append((kind, value))
        elif joined[-1][1] != ",":  # the Oxford comma already separates "46, and 82"
            joined.append(("op", ","))
    return joined


# Each \pm doubles the values of the expression around it: "\pm\sqrt{2 \pm \sqrt{3}}" is four numbers. Real
# answers have one or two \pm per value; the bound stops "-\pm\pm...\pm 1" (2^20 values in 71 characters)
# and nested "\sqrt{1 \pm \sqrt{1 \pm ...}}" from costing exponential time and memory in-process.
MAX_PLUS_MINUS_VALUES = 16

_ARITHMETIC_KINDS = ("add", "mul", "div", "neg", "pow", "fn", "pct")


def _expand_plus_minus(node: tuple) -> tuple:
    """The tree with each \\pm value made the set of its values; in a set or list they join the other items.

    "x = \\frac{1 \\pm \\sqrt5}{2}" answers "\\frac{1+\\sqrt5}{2}, \\frac{1-\\sqrt5}{2}"; "\\pm 1, \\pm 2" is 4 roots.
    """
    kind = node[0]
    if kind == "pm" or kind in _ARITHMETIC_KINDS:
        values = _values(node)
        return values[0] if len(values) == 1 else ("set", tuple(values))
    if kind == "set":
        return ("set", tuple(value for item in node[1] for value in _values(item)))
    if kind in ("tuple", "ratio", "union", "chain"):
        return (kind, tuple(_expand_plus_minus(item) for item in node[1]))
    if kind == "matrix":
        return ("matrix", tuple(tuple(_expand_plus_minus(entry) for entry in row) for row in node[1]))
    if kind == "interval":
        return ("interval", node[1], _expand_plus_minus(node[2]), _expand_plus_minus(node[3]), node[4])
    if kind == "eq":
        return ("eq", _expand_plus_minus(node[1]), _expand_plus_minus(node[2]))
    if kind == "rel":
        return ("rel", node[1], _expand_plus_minus(node[2]), _expand_plus_minus(node[3]))
    return node  # num, sym, const, text


def _values(node: tuple) -> list[tuple]:
    """The values an expression stands for: one, or one per choice of sign at each \\pm inside it."""
    kind = node[0]
    if kind == "pm":
        base, offset = node[1], node[2]
        offsets = _values(offset)
        if base is None:
            values = offsets + [("neg", o) for o in offsets]
        else:
            sums = _combinations([_values(base), offsets + [("neg", o) for o in offsets]])
            values = [_flat("add", list(terms)) for terms in sums]
    elif kind in ("add", "mul"):
        values = [_flat(kind, list(parts)) for parts in _combinations([_values(part) for part in node[1]])]
    elif kind in ("div", "pow"):
        values = [(kind, a, b) for a, b in _combinations([_values(node[1]), _values(node[2])])]
    elif kind in ("neg", "pct"):
        values = [(kind, value) for value in _values(node[1])]
    elif kind == "fn":
        values = [("fn", node[1], args) for args in _combinations([_values(arg) for arg in node[2]])]
    else:
        return [_expand_plus_minus(node)]
    if len(values) > MAX_PLUS_MINUS_VALUES:
        raise ParseError("too many \\pm")
    return values


def _combinations(choices: list[list[tuple]]) -> list[tuple]:
    """Every pick of one value per operand; refused as soon as there are more than MAX_PLUS_MINUS_VALUES."""
    picks: list[tuple] = [()]
    for options in choices:
        picks = [pick + (option,) for pick in picks for option in options]
        if len(picks) > MAX_PLUS_MINUS_VALUES:
            raise ParseError("too many \\pm")
    return picks


def _sci_to_pow(s: str) -> str:
    """1.5e3 and 1.5 \\times 10^{3} -> 1.5*10^{3} so both spellings read the same.

    The rule for E-notation, `<mantissa>e<exponent>` written with no spaces: it is scientific notation only
    when it is a literal of its own (no letter, digit, '.', '\\', '^' glued on either side; exponent of at most
    4 digits) and it cannot be meant as an expression in Euler's e, that is when
      - the mantissa has a decimal point: 1.5e3, 1.2e-4, 6.02e23, or
      - the exponent is unsigned: 2e10, 1e3 (no one writes 2e*10 as "2e10"), or
      - the mantissa is exactly 1: 1e-3, 1e+6 (no one writes e - 3 as "1e-3").
    An integer mantissa other than 1 with a signed exponent, like 2e-1 or 4e+2, is the expression 2e - 1 or
    4e + 2 (math-verify's reading of every E-notation), so it neither equals 0.2 nor 400.
    """
    if not re.search(r"\d", s):
        return s

    def e_notation(match: re.Match) -> str:
        mantissa, sign, digits = match.groups()
        if sign and "." not in mantissa and mantissa.lstrip("0") != "1":
            return match.group(0)  # ambiguous: Euler's e in an expression
        return mantissa + "*10^{" + sign + digits + "}"

    s = _E_NOTATION_RE.sub(e_notation, s)
    return _TIMES_TEN_RE.sub(lambda match: "*10^{" + match.group(1) + "}", s)
