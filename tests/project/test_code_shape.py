"""The read side (dashboards/) stays readable at a glance: no function or method in it is
more tangled or longer than a reader can hold in their head at once.

Complexity is radon's cyclomatic complexity; length runs from the `def` line to the
function's last line (closing brackets included, which radon's own end line leaves out).
Pure source reading: no database, no Redis.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

from radon.complexity import add_inner_blocks, cc_visit
from radon.visitors import Function

ROOT = Path(__file__).resolve().parents[2]
READ_SIDE = ROOT / "dashboards"
MAX_COMPLEXITY = 15
MAX_LINES = 60


def _functions(path: Path) -> Iterator[tuple[Function, int]]:
    """Every function, method and closure in `path`, with its length in lines."""
    source = path.read_text()
    last_line = {
        node.lineno: node.end_lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    for block in add_inner_blocks(cc_visit(source)):
        if isinstance(block, Function):
            end = max(block.endline, last_line.get(block.lineno) or block.endline)
            yield block, end - block.lineno + 1


def _offenders() -> list[str]:
    found = []
    for path in sorted(READ_SIDE.rglob("*.py")):
        for function, length in _functions(path):
            if function.complexity > MAX_COMPLEXITY or length > MAX_LINES:
                found.append(
                    f"{path.relative_to(ROOT)}:{function.lineno} {function.fullname} "
                    f"{function.complexity}/{length}"
                )
    return found


def test_the_read_side_has_no_function_too_complex_or_too_long() -> None:
    offenders = _offenders()
    assert not offenders, (
        f"over complexity {MAX_COMPLEXITY} or {MAX_LINES} lines (file:line name "
        f"complexity/length); split them:\n" + "\n".join(offenders)
    )


def test_the_measure_sees_methods_closures_and_closing_brackets(tmp_path: Path) -> None:
    """A check that measured nothing would always pass: a method and a closure with 16
    branches are caught, and a call's closing bracket counts toward a function's length."""
    assignments = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    branches = "".join(f"        if a == {i}:\n            return {i}\n" for i in range(16))
    path = tmp_path / "sample.py"
    path.write_text(
        f"def long():\n{assignments}    return max(\n        x0,\n    )\n\n\n"
        f"class Holder:\n    def method(self, a):\n{branches}\n\n"
        f"def outer():\n    def inner(a):\n{branches}    return inner\n"
    )
    measured = {function.fullname: (function.complexity, n) for function, n in _functions(path)}
    assert measured["long"] == (1, MAX_LINES + 4)
    assert measured["Holder.method"][0] == 17
    assert measured["outer.inner"][0] == 17
