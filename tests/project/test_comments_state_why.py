"""Product comments and docstrings say why, not what was measured on which evening.

No comment or docstring in a product package quotes an issue number (`#21`, `(#23)`), a
session, or a measured time, percentage or ratio (µs, "3 ms", "40%", "10x"). Figures live
in docs/ (docs/BENCHMARKS.md and the rest), history in git; a comment may point at the
doc that holds a figure without quoting it. Configuration facts stay: defaults in
seconds, limits in bytes, HTTP status codes, version numbers.

Plain Python, no database: every .py file is tokenized (its comments) and parsed (its
docstrings, and any other bare string statement), and every .lua file's `--` comments
are read.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The product packages. Migrations are history by nature and are left out.
PACKAGES = (
    "core",
    "tenants",
    "webhooks",
    "delivery",
    "ingest",
    "simulation",
    "project",
    "dashboards",
)

# What a comment or docstring must not quote. Each pattern runs on one line of text.
PATTERNS = {
    # "#21", "(#23)", "issue #22"; not a URL's fragment (`page#12`: preceded by a
    # non-space) and not a CSS colour (see _is_colour).
    "issue number": re.compile(r"(?<![^\s(\[,;])#\d+\b"),
    # "~10 µs", "0.25 us" (µ spelt in ASCII, as in Lua): no configuration is given in it.
    "microseconds": re.compile(r"(?:\d+(?:\.\d+)?\s?)?[µμ]s\b|\d+(?:\.\d+)?\s?us\b"),
    # "2.7 ms", "~7 ms", "50ms".
    "milliseconds": re.compile(r"\d[\d,]*(?:\.\d+)?\s?ms\b"),
    # "40%", "12 %", "0.81%".
    "percentage": re.compile(r"\d+(?:\.\d+)?\s?%"),
    # "15" then the multiplication sign (U+00D7), "0.29 " then it, "10x"; not "0x1F" or
    # "5xx" (no word boundary after the x).
    "ratio": re.compile(r"\d+(?:\.\d+)?\s?\u00d7|\b\d+(?:\.\d+)?x\b"),
    # "session 5": when something was measured, not why the code is so.
    "session": re.compile(r"\bsession \d+", re.IGNORECASE),
}

# Any of them, anywhere in a file: a file without a match has nothing to tokenize.
ANY_PATTERN = re.compile("|".join(f"(?:{p.pattern})" for p in PATTERNS.values()), re.IGNORECASE)

_COLOUR_WORDS = re.compile(r"colou?r|fill|stroke|background|border", re.IGNORECASE)

# (path, text the line contains, pattern name): figures that are facts, not measurements.
# Keep this short, and say why each entry is here.
ALLOWED = {
    # HyperLogLog's standard error is a documented property of Redis's implementation
    # (under 1%), not a figure we measured.
    ("webhooks/key_hygiene.py", "about 1% error", "percentage"),
}


def _is_colour(line: str, match: re.Match) -> bool:
    """`#ba2121`, `#555`: a hex colour, by its length and a colour word before it."""
    digits = re.match(r"#([0-9A-Fa-f]+)", line[match.start() :])
    if digits is None or len(digits.group(1)) not in (3, 4, 6, 8):
        return False
    return bool(_COLOUR_WORDS.search(line[max(0, match.start() - 40) : match.start()]))


def _statements(body: list[ast.stmt]):
    """Every statement in `body` and in the blocks nested in it (no expressions: a
    docstring is a statement of its own)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield from _statements(block)


def _quoted(text: str) -> list[tuple[str, str]]:
    """(pattern name, what it matched) for every figure or issue number in `text`."""
    return [
        (name, match.group(0))
        for name, pattern in PATTERNS.items()
        for match in pattern.finditer(text)
        if not (name == "issue number" and _is_colour(text, match))
    ]


def _python_texts(path: Path, source: str):
    """(line number, text) of every comment and every docstring line in `source`."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string[1:]
    for node in _statements(ast.parse(source, filename=str(path)).body):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for offset, line in enumerate(node.value.value.splitlines()):
                yield node.value.lineno + offset, line


def _lua_comment(line: str) -> str | None:
    """The `--` comment on a Lua line, outside any quoted string; None if there is none."""
    quote = None
    index = 0
    while index < len(line):
        char = line[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif line.startswith("--", index):
            return line[index + 2 :]
        index += 1
    return None


def _lua_texts(source: str):
    in_block = False
    for number, line in enumerate(source.splitlines(), 1):
        if in_block:
            yield number, line
            in_block = "]]" not in line
            continue
        comment = _lua_comment(line)
        if comment is None:
            continue
        if comment.startswith("[[") or comment.startswith("[=["):
            in_block = "]]" not in comment
        yield number, comment


def _product_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if "migrations" in path.parts or "__pycache__" in path.parts:
                continue
            if path.suffix in (".py", ".lua") and path.is_file():
                yield path


def _findings() -> list[str]:
    found = []
    for path in _product_files():
        relative = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        if not ANY_PATTERN.search(source):
            continue  # nothing in the file could match, in a comment or anywhere else
        texts = _lua_texts(source) if path.suffix == ".lua" else _python_texts(path, source)
        for number, text in texts:
            quoted = [
                f"{name} {matched!r}"
                for name, matched in _quoted(text)
                if not any(
                    relative == allowed_path and snippet in text and name == allowed_name
                    for allowed_path, snippet, allowed_name in ALLOWED
                )
            ]
            if quoted:
                found.append(f"{relative}:{number}: {', '.join(quoted)}: {text.strip()}")
    return found


def test_no_comment_or_docstring_quotes_a_figure_or_an_issue():
    found = _findings()
    assert not found, (
        "Comments and docstrings say why; figures belong in docs/, history in git "
        "(point at the doc instead):\n" + "\n".join(found)
    )


def test_the_allowlist_has_no_stale_entries():
    """Each allowed line still exists, so the list cannot quietly outlive its reason."""
    for allowed_path, snippet, _name in ALLOWED:
        assert snippet in (ROOT / allowed_path).read_text(encoding="utf-8"), allowed_path


def test_the_patterns_catch_what_they_are_for():
    def names(text: str) -> set[str]:
        return {name for name, _matched in _quoted(text)}

    assert names("as #21 defines them") == {"issue number"}
    assert names("the figures (#23)") == {"issue number"}
    assert names("see https://example.com/page#12 and color: #555") == set()
    assert names("cost ~10 µs per call, 0.25 us apart") == {"microseconds"}
    assert names("2.7 ms against 0.45ms") == {"milliseconds"}
    assert names("about 40% of it, 12 % of that") == {"percentage"}
    assert names("15\u00d7 slower, 0.29 \u00d7 urllib3, 10x less") == {"ratio"}
    assert names("Results, session 5") == {"session"}
    # Configuration facts and code stay.
    assert names("default 30 s, at most 64 shards, a 429 or 503, 5xx, 16 KiB, 0x1F, %s") == set()
    assert names("TIMEOUT_MS and COUNT_WITHIN_MS; Redis 7+; pycurl 7.49") == set()
