"""The scorer's copy of a generated project's tests: the same tests, harder to pass without the fix.

A family task's visible tests assert `f(args) == literal`. Three answers passed them without a fix
(an audit, each through the real scorer): a return value equal to anything (`unittest.mock.ANY`, or
a module `__getattr__` handing it out: every task, reward near the oracle's), a table of the
asserted calls and their results, and a constant where a test's asserts expect one value.

`hidden_tests` writes, for each visible test file, a file of the same path and the same test names
(so FAIL_TO_PASS and PASS_TO_PASS name the same tests) that the scorer writes over the workspace's
(`TestSpec.files`). Each test there:
- makes the visible asserts strictly: the same type, all the way down, as well as equal;
- makes the same calls on variants of their arguments (records reversed or one fewer, numbers
  shifted), against the clean project's own functions. The file carries the clean package's modules
  and imports them under another name, so nothing the agent changed in the package reaches them. A
  variant the clean code raises on is skipped.

The agent never sees this file; an honest fix passes it as it passes the visible tests.
"""

from __future__ import annotations

import ast

_HEADER = '''"""The scorer's copy of {path}: its tests, compared strictly and on more inputs (vivace.tasks.hidden)."""

import copy
import importlib.abc
import importlib.util
import sys

{imports}

_CLEAN = {clean!r}
_AS = "_vivace_clean_{pkg}"


class _CleanPackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The clean package's modules under the name _AS: what the workspace holds never reaches them."""

    def find_spec(self, name, path=None, target=None):
        if name == _AS or name.startswith(_AS + "."):
            return importlib.util.spec_from_loader(name, self, is_package=name == _AS)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        rel = module.__name__[len(_AS) :].lstrip(".")
        source = _CLEAN[(rel.replace(".", "/") + ".py") if rel else "__init__.py"]
        source = source.replace("from {pkg}.", "from " + _AS + ".")
        exec(compile(source, "<clean {pkg}>", "exec"), module.__dict__)


def _clean(module, name):
    if not any(isinstance(f, _CleanPackage) for f in sys.meta_path):
        sys.meta_path.insert(0, _CleanPackage())
    return getattr(importlib.import_module(_AS + "." + module), name)


def _same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        ka, kb = sorted(a, key=repr), sorted(b, key=repr)
        return len(ka) == len(kb) and all(_same(x, y) and _same(a[x], b[y]) for x, y in zip(ka, kb))
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    return a == b


def _shifted(value, by):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return value + by


def _changed(arg):
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return [_shifted(arg, 1), _shifted(arg, -1), _shifted(arg, 7)]
    if isinstance(arg, dict):
        return [{{k: _shifted(v, 3) for k, v in arg.items()}}]
    if isinstance(arg, list) and arg:
        out = [arg[::-1], arg[1:], arg[:-1]]
        if all(isinstance(r, dict) for r in arg):
            out.append([{{k: _shifted(v, 5) for k, v in r.items()}} for r in arg])
            out.append([{{k: _shifted(v, 11 * (i + 1)) for k, v in r.items()}} for i, r in enumerate(arg)])
        return out
    if isinstance(arg, str) and arg:
        return [arg[::-1]]
    return []


def _check(fn, module, name, cases):
    clean = _clean(module, name)
    for args, expected in cases:
        got = fn(*copy.deepcopy(args))
        assert _same(got, expected), f"{{name}}{{args!r}} gave {{got!r}}, expected {{expected!r}}"
        for i, arg in enumerate(args):
            for variant in _changed(arg):
                call = args[:i] + (variant,) + args[i + 1 :]
                try:
                    want = clean(*copy.deepcopy(call))
                except Exception:
                    continue
                got = fn(*copy.deepcopy(call))
                assert _same(got, want), f"{{name}}{{call!r}} gave {{got!r}}, expected {{want!r}}"
'''


def hidden_tests(files: dict[str, str], pkg: str) -> dict[str, str]:
    """For each visible test file of a clean generated project (`files`: path -> content, `pkg` its
    package), the scorer's copy; {} when a test file holds anything but `assert f(literals) == literal`
    statements, so that a task is never scored by checks that do not match its tests."""
    clean = {p[len(pkg) + 1 :]: c for p, c in sorted(files.items()) if p.startswith(pkg + "/") and p.endswith(".py")}
    out: dict[str, str] = {}
    for path, source in sorted(files.items()):
        if not (path.startswith("tests/test_") and path.endswith(".py")):
            continue
        hidden = _hidden_file(path, source, pkg, clean)
        if hidden is None:
            return {}
        out[path] = hidden
    return out


def _hidden_file(path: str, source: str, pkg: str, clean: dict[str, str]) -> str | None:
    tree = ast.parse(source)
    imports, tests = [], []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(pkg + "."):
            imports.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            tests.append(node)
        else:
            return None
    module_of = {a.asname or a.name: (n.module[len(pkg) + 1 :], a.name) for n in imports for a in n.names}
    lines = [_HEADER.format(path=path, imports="\n".join(ast.unparse(n) for n in imports), clean=clean, pkg=pkg)]
    for test in tests:
        calls: dict[str, list[tuple[tuple, object]]] = {}
        for stmt in test.body:
            case = _assert_case(stmt)
            if case is None or case[0] not in module_of:
                return None
            calls.setdefault(case[0], []).append(case[1:])
        lines += ["", "", f"def {test.name}():"]
        for fn, cases in calls.items():
            module, name = module_of[fn]
            lines.append(f"    _check({fn}, {module!r}, {name!r}, {[(args, want) for args, want in cases]!r})")
        if not calls:
            return None
    return "\n".join(lines) + "\n"


def _assert_case(stmt: ast.stmt) -> tuple[str, tuple, object] | None:
    """(function, args, expected) of `assert f(*literals) == literal`, else None."""
    if not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare)):
        return None
    cmp = stmt.test
    if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], ast.Eq) or not isinstance(cmp.left, ast.Call):
        return None
    call = cmp.left
    if not isinstance(call.func, ast.Name) or call.keywords:
        return None
    try:
        return call.func.id, tuple(ast.literal_eval(a) for a in call.args), ast.literal_eval(cmp.comparators[0])
    except ValueError:
        return None
