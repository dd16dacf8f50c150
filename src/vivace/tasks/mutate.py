"""Bug injection: single-line mutations of Python source, found with `ast`.

Each operator proposes candidate mutations of one line (the line's text before and after),
so the fix is a one-line reference patch and formatting elsewhere is untouched. Whether a
mutant is a real task — the tests catch it, and undoing it fixes them — is decided by the
generator, which runs the tests (generate.py).

Kinds: comparison_flip, operator_swap, off_by_one, wrong_variable, removed_statement,
negated_condition, wrong_return, swapped_arguments, boolean_swap.
Not covered: multi-line mutations, and mutations inside nested functions' closures chosen
for semantic subtlety (every candidate is syntactic; the tests decide which ones matter).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

KINDS = (
    "comparison_flip",
    "operator_swap",
    "off_by_one",
    "wrong_variable",
    "removed_statement",
    "negated_condition",
    "wrong_return",
    "swapped_arguments",
    "boolean_swap",
)

_COMPARE = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
            ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}  # fmt: skip
_BINOP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
          ast.FloorDiv: ("//", "*"), ast.Mod: ("%", "//")}  # fmt: skip


@dataclass(frozen=True)
class Mutation:
    kind: str
    path: str  # file, relative to the repository root
    line: int  # 1-based
    before: str  # the original line (without newline)
    after: str  # the mutated line ("" removes the line)
    function: str  # enclosing function or method (Class.method)
    description: str  # what changed, for metadata

    def apply(self, source: str) -> str:
        lines = source.split("\n")
        assert lines[self.line - 1] == self.before, "the source changed since the mutation was proposed"
        if self.after == "":
            del lines[self.line - 1]
        else:
            lines[self.line - 1] = self.after
        return "\n".join(lines)


def mutations(path: str, source: str) -> list[Mutation]:
    """Every candidate single-line mutation of a Python file (deterministic order)."""
    tree = ast.parse(source)
    lines = source.split("\n")
    blocks = [(min([n.lineno] + [d.lineno for d in n.decorator_list]), n.end_lineno, n.col_offset)
              for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]  # fmt: skip
    found: list[Mutation] = []
    seen: set[tuple[int, str]] = set()
    for func, scope, node in _walk_with_function(tree):
        for kind, line_no, new_line, desc in _propose(node, lines, scope):
            old = lines[line_no - 1]
            if new_line == old or (line_no, new_line) in seen:
                continue
            if new_line and not _parses(lines, line_no, new_line, blocks):
                continue
            seen.add((line_no, new_line))
            found.append(Mutation(kind, path, line_no, old, new_line, func, desc))
    return found


def _parses(lines: list[str], line_no: int, new_line: str, blocks: list[tuple[int, int, int]]) -> bool:
    """Whether the file parses with line `line_no` replaced. The innermost function or class holding the
    line (`blocks`: each one's first and last line and its column) is parsed first, under an `if 1:` when
    it is indented; that is enough when it parses, since it then ends with no bracket or string open and
    the rest of the file reads as before. When it does not, the whole file decides (a quote or bracket the
    change opens may close further on). Parsing one function instead of the file lists the bundled
    repositories' candidates ~6x faster, with the same result."""
    inside = [b for b in blocks if b[0] <= line_no <= b[1]]
    first, last, column = min(inside, key=lambda b: b[1] - b[0]) if inside else (1, len(lines), 0)
    local = (["if 1:"] if column else []) + lines[first - 1 : line_no - 1] + [new_line] + lines[line_no:last]
    whole = lines[: line_no - 1] + [new_line] + lines[line_no:]
    for text in (local, whole):
        try:
            ast.parse("\n".join(text))
            return True
        except SyntaxError:
            continue
    return False


def _walk_with_function(tree: ast.AST) -> Iterator[tuple[str, dict[str, int], ast.AST]]:
    """(enclosing function name, its locals, node) for every node inside a function body."""

    def visit(node: ast.AST, func: str | None, scope: dict[str, int], cls: str | None) -> Iterator:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, func, scope, child.name)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{cls}.{child.name}" if cls and func is None else child.name
                yield name, _locals(child), child  # for statements removed from its body
                for part in child.body:  # not the signature: annotations and defaults are not mutated
                    yield name, _locals(child), part
                    yield from visit(part, name, _locals(child), None)
            elif func is not None:  # module-level code (constants, imports) is not mutated
                yield func, scope, child
                yield from visit(child, func, scope, cls)
            else:
                yield from visit(child, func, scope, cls)

    yield from visit(tree, None, {}, None)


def _one_line(node: ast.AST) -> bool:
    return getattr(node, "lineno", None) is not None and node.lineno == node.end_lineno  # type: ignore[attr-defined]


def _replace(lines: list[str], node: ast.AST, text: str) -> str:
    line = lines[node.lineno - 1]  # type: ignore[attr-defined]
    return line[: node.col_offset] + text + line[node.end_col_offset :]  # type: ignore[attr-defined]


def _segment(lines: list[str], node: ast.AST) -> str:
    return lines[node.lineno - 1][node.col_offset : node.end_col_offset]  # type: ignore[attr-defined]


def _swap_op_between(lines: list[str], left: ast.AST, right: ast.AST, old: str, new: str) -> str | None:
    """Replaces the operator token `old` that sits between two operands on one line."""
    if not (_one_line(left) and _one_line(right)) or left.lineno != right.lineno:  # type: ignore[attr-defined]
        return None
    line = lines[left.lineno - 1]  # type: ignore[attr-defined]
    a, b = left.end_col_offset, right.col_offset  # type: ignore[attr-defined]
    gap = line[a:b]
    hits = [
        m.start()
        for m in re.finditer(re.escape(old) + r"(?![=/*<>])", gap)
        if gap[max(0, m.start() - 1)] not in "=!<>/*"
    ]
    if len(hits) != 1:
        return None
    i = a + hits[0]
    return line[:i] + new + line[i + len(old) :]


def _propose(node: ast.AST, lines: list[str], scope: dict[str, int]) -> Iterator[tuple[str, int, str, str]]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        old, new = _COMPARE[type(node.ops[0])]
        line = _swap_op_between(lines, node.left, node.comparators[0], old, new)
        if line:
            yield "comparison_flip", node.lineno, line, f"{old} -> {new}"
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        old, new = _BINOP[type(node.op)]
        line = _swap_op_between(lines, node.left, node.right, old, new)
        if line:
            yield "operator_swap", node.lineno, line, f"{old} -> {new}"
    if isinstance(node, ast.Compare | ast.BinOp | ast.Subscript | ast.Call):
        yield from _off_by_one(node, lines)
    if isinstance(node, ast.BoolOp) and len(node.values) == 2 and _one_line(node):
        a, b = (_segment(lines, v) for v in node.values)
        op = "or" if isinstance(node.op, ast.And) else "and"
        yield "boolean_swap", node.lineno, _replace(lines, node, f"{a} {op} {b}"), f"-> {op}"
    if isinstance(node, ast.If | ast.While) and _one_line(node.test):
        test = _segment(lines, node.test)
        if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
            new = _segment(lines, node.test.operand)
        else:
            new = f"not ({test})" if isinstance(node.test, ast.BoolOp | ast.Compare) else f"not {test}"
        yield "negated_condition", node.test.lineno, _replace(lines, node.test, new), f"negated `{test}`"
    if isinstance(node, ast.Return) and node.value is not None and _one_line(node):
        yield from _wrong_return(node, lines)
    if isinstance(node, ast.Call) and len(node.args) >= 2 and all(_one_line(a) for a in node.args[:2]):
        a, b = node.args[:2]
        if (
            a.lineno == b.lineno
            and not isinstance(a, ast.Starred | ast.Constant)
            and _segment(lines, a) != _segment(lines, b)
        ):
            line = lines[a.lineno - 1]
            sa, sb = _segment(lines, a), _segment(lines, b)
            new = line[: a.col_offset] + sb + line[a.end_col_offset : b.col_offset] + sa + line[b.end_col_offset :]
            yield "swapped_arguments", a.lineno, new, f"swapped {sa} and {sb}"
    for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
        if isinstance(body, list) and len(body) > 1:
            for stmt in body:
                if isinstance(stmt, ast.Assign | ast.AugAssign | ast.Expr) and _one_line(stmt):
                    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                        continue  # a docstring
                    yield "removed_statement", stmt.lineno, "", f"removed `{_segment(lines, stmt).strip()}`"
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and scope and _one_line(node):
        yield from _wrong_variable(node, lines, scope)


def _off_by_one(node: ast.AST, lines: list[str]) -> Iterator[tuple[str, int, str, str]]:
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id == "range"):
            return
        operands = node.args
    elif isinstance(node, ast.Subscript):
        s = node.slice
        operands = [x for x in ((s.lower, s.upper) if isinstance(s, ast.Slice) else (s,)) if x is not None]
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
    else:
        operands = [node.left, node.right]  # type: ignore[attr-defined]
    for c in operands:
        if isinstance(c, ast.Constant) and type(c.value) is int and _one_line(c):
            delta = 1 if c.value <= 1 else -1
            yield "off_by_one", c.lineno, _replace(lines, c, str(c.value + delta)), f"{c.value} -> {c.value + delta}"


def _wrong_return(node: ast.Return, lines: list[str]) -> Iterator[tuple[str, int, str, str]]:
    v = node.value
    if isinstance(v, ast.Constant):
        if isinstance(v.value, bool):
            new = str(not v.value)
        elif type(v.value) is int:
            new = str(v.value + 1)
        else:
            return
    elif isinstance(v, ast.Name | ast.Call | ast.BinOp | ast.Attribute | ast.Subscript | ast.Compare):
        new = "not " + _segment(lines, v) if isinstance(v, ast.Compare) else "None"
    else:
        return
    yield "wrong_return", node.lineno, _replace(lines, v, new), f"returns {new}"  # type: ignore[arg-type]


def _wrong_variable(node: ast.Name, lines: list[str], scope: dict[str, int]) -> Iterator[tuple[str, int, str, str]]:
    # Another local variable of the function, already bound at this line and named on the same
    # line: in scope and plausibly confusable (a real slip, not a NameError).
    if node.id not in scope:
        return
    line = lines[node.lineno - 1]
    for other in sorted(set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", line)) - {node.id}):
        if other in scope and scope[other] < node.lineno:
            yield "wrong_variable", node.lineno, _replace(lines, node, other), f"{node.id} -> {other}"
            return


def _locals(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, int]:
    """Parameters and assigned names of a function (not nested ones) -> the line first bound."""
    scope: dict[str, int] = {}
    a = func.args
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
        if arg is not None and arg.arg not in ("self", "cls"):
            scope[arg.arg] = func.lineno
    for n in ast.walk(func):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            scope[n.id] = min(scope.get(n.id, n.lineno), n.lineno)
    return scope
