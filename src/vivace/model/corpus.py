"""The reference tokenizer's training corpus: vivace's code, then harness conversations.

`build_corpus` yields every `.py`/`.md`/`.toml` file of `src/vivace/` (the bundled repositories
included), then seeded conversations per bundled repository rendered exactly as the harness
renders them: the real system prompt, the real tool schemas and the real tools' result texts
(read_file, edit_file, list_dir, todo_write and read_lints run on an in-memory copy of the
repository; grep and glob_file_search go through the walker's format; test runs are
synthesized), so the vocabulary is spent on what a coding agent reads and writes.

The corpus follows the source tree: rebuilding after code changes gives a different (equally
valid) tokenizer.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import functools
import json
import posixpath
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from vivace.harness.chat import QWEN_TEMPLATE, SPECIAL_TOKENS, ChatFormat
from vivace.harness.messages import Message, ToolCall
from vivace.harness.prompts import SYSTEM_PROMPT
from vivace.harness.tools import default_tools, tools_by_name
from vivace.harness.tools.base import Tool, ToolContext, ToolResult, parse_args, tool_schema
from vivace.harness.tools.search import SearchHit
from vivace.sandbox.base import DirEntry, ExecResult, FileStat, NotAFileError, PathEscapeError, WorkspaceFileNotFound
from vivace.tasks.format import BUNDLED_REPOS, bundled_repos

VIVACE_SRC = Path(__file__).resolve().parents[1]
CODE_SUFFIXES = (".py", ".md", ".toml")
CORPUS_SEED = 0
CONVERSATIONS_PER_REPO = 8


def build_corpus(seed: int = CORPUS_SEED) -> Iterator[str]:
    """The training texts: every code file, then the harness conversations."""
    yield from code_texts()
    yield from conversation_texts(seed)


def code_files() -> list[Path]:
    """vivace's own source and the bundled repositories: .py, .md and .toml files, in path order."""
    files = [  # hidden parts below the package only: an install under `.venv/` or `~/.local/` holds every file
        p
        for p in VIVACE_SRC.rglob("*")
        if p.suffix in CODE_SUFFIXES
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(VIVACE_SRC).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(VIVACE_SRC).as_posix())


def code_texts() -> Iterator[str]:
    for p in code_files():
        yield p.read_text(encoding="utf-8", errors="replace")


def conversation_texts(seed: int = CORPUS_SEED, per_repo: int = CONVERSATIONS_PER_REPO) -> Iterator[str]:
    """Rendered agent conversations on the bundled repositories (system prompt, tool schemas,
    parallel tool calls and their results), `per_repo` for each repository."""
    fmt = ChatFormat(_template_only_tokenizer())
    schemas = [tool_schema(t) for t in default_tools()]
    for name in bundled_repos():
        repo = _Repo.load(BUNDLED_REPOS / name)
        for i in range(per_repo):
            episode = _Episode(repo, random.Random(f"{seed}:{name}:{i}"))
            yield fmt.render(episode.run(), schemas)


def _template_only_tokenizer() -> PreTrainedTokenizerFast:
    """Enough of a tokenizer for ChatFormat.render (which never tokenizes)."""
    tok = Tokenizer(models.BPE())
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=QWEN_TEMPLATE)


@dataclass
class _Repo:
    name: str
    files: dict[str, str]  # workspace path -> text
    sources: list[str]  # package modules with functions
    tests: list[str]

    @staticmethod
    def load(root: Path) -> _Repo:
        files = {}
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and "__pycache__" not in rel and not any(s.startswith(".") for s in rel.split("/")):
                data = p.read_bytes()
                if b"\0" not in data:
                    files[rel] = data.decode("utf-8", errors="replace")
        py = [f for f in files if f.endswith(".py")]
        tests = [f for f in py if f.split("/")[-1].startswith("test_")]
        sources = [f for f in py if f not in tests and not f.startswith("tests/") and _functions(files[f])]
        return _Repo(root.name, files, sources, tests)


@dataclass(frozen=True)
class _Function:
    name: str
    line: int  # 1-based line of the `def`
    end: int
    body: int  # 1-based line of the first statement after the docstring
    params: tuple[str, ...]
    doc: str  # first line of the docstring, or ""


@functools.lru_cache(maxsize=256)
def _functions(source: str) -> tuple[_Function, ...]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("__"):
            params = tuple(a.arg for a in node.args.args if a.arg not in ("self", "cls"))
            doc = (ast.get_docstring(node) or "").strip().split("\n")[0]
            first = node.body[1] if doc and len(node.body) > 1 else node.body[0]
            end = node.end_lineno or node.lineno
            out.append(_Function(node.name, node.lineno, end, first.lineno, params, doc))
    return tuple(sorted(out, key=lambda f: f.line))


class _MemoryWorkspace:
    """The Workspace protocol over a dict of files, so the real tools produce their real result
    texts without a sandbox. Commands are answered from a small script (see `exec`)."""

    id = "corpus"

    def __init__(self, files: dict[str, str], rng: random.Random):
        self.base, self.files, self.rng = files, dict(files), rng
        self.failing_test: str | None = None  # the next pytest run fails this test (then passes)

    def _path(self, path: str) -> str:
        p = path.strip()
        p = p[len("/workspace") :] if p == "/workspace" or p.startswith("/workspace/") else p
        if p.startswith("/"):
            raise PathEscapeError(f"{path} is outside the workspace")
        p = posixpath.normpath(p.lstrip("/") or ".")
        if p == ".." or p.startswith("../"):
            raise PathEscapeError(f"{path} is outside the workspace")
        return p

    def _is_dir(self, p: str) -> bool:
        return p == "." or any(f.startswith(p + "/") for f in self.files)

    async def read_bytes(self, path: str) -> bytes:
        p = self._path(path)
        if p in self.files:
            return self.files[p].encode("utf-8")
        if self._is_dir(p):
            raise NotAFileError(f"{path} is a directory")
        raise WorkspaceFileNotFound(path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        self.files[self._path(path)] = data.decode("utf-8", errors="replace")

    async def list(self, path: str = ".") -> list[DirEntry]:
        p = self._path(path)
        if p in self.files:
            raise NotAFileError(f"{path} is not a directory")
        if not self._is_dir(p):
            raise WorkspaceFileNotFound(path)
        prefix = "" if p == "." else p + "/"
        entries: dict[str, DirEntry] = {}
        for f, text in self.files.items():
            if f.startswith(prefix):
                head, _, rest = f[len(prefix) :].partition("/")
                entries[head] = DirEntry(head, "dir", 4096) if rest else DirEntry(head, "file", len(text.encode()))
        return [entries[k] for k in sorted(entries)]

    async def stat(self, path: str) -> FileStat:
        p = self._path(path)
        if p in self.files:
            return FileStat(p, "file", len(self.files[p].encode()), 0o644, 0.0)
        if self._is_dir(p):
            return FileStat(p, "dir", 4096, 0o755, 0.0)
        raise WorkspaceFileNotFound(path)

    async def remove(self, path: str, recursive: bool = False) -> None:
        self.files.pop(self._path(path), None)

    async def diff(self) -> str:
        out = []
        for f in sorted(set(self.base) | set(self.files)):
            old, new = self.base.get(f), self.files.get(f)
            if old != new:
                out.append(f"diff --git a/{f} b/{f}\n")
                a = (old or "").splitlines(keepends=True)
                b = (new or "").splitlines(keepends=True)
                out += difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{f}", f"b/{f}", n=3)
        return "".join(out)

    async def close(self) -> None:
        pass

    async def exec(self, cmd: str | list[str], timeout: float | None = None, env: dict | None = None) -> ExecResult:
        duration = round(self.rng.uniform(0.05, 1.5), 3)
        if isinstance(cmd, list) and cmd[:2] == ["sh", "-c"] and "exec rg" in cmd[2]:
            return ExecResult("", "", 127, duration)  # no ripgrep: grep uses the walker, whose format is rg's
        if isinstance(cmd, list) and cmd[:2] == ["python3", "-c"]:
            return self._walker(json.loads(cmd[3]), duration)
        if isinstance(cmd, list) and cmd[:2] == ["sh", "-c"] and "ruff" in cmd[2]:
            return ExecResult("/workspace\n/workspace\n[]\n", "", 0, duration)
        command = cmd if isinstance(cmd, str) else " ".join(cmd)
        if "pytest" in command:
            return self._pytest(command, duration)
        if command.startswith("git diff"):
            return ExecResult(await self.diff(), "", 0, duration)
        return ExecResult("", "", 0, duration)

    def _walker(self, a: dict[str, Any], duration: float) -> ExecResult:
        root = a["path"]
        names = sorted(
            (f for f in self.files if root == "." or f == root or f.startswith(root + "/")), key=lambda f: f.split("/")
        )
        keep = _glob_matcher(a.get("glob"))
        if a["mode"] == "glob":
            found = [f for f in names if keep(f if root == "." else posixpath.relpath(f, root))]
            return ExecResult("".join(f + "\n" for f in found), "", 0, duration)
        rx = re.compile(a["pattern"], re.I if a["ignore_case"] else 0)
        out = []
        for f in names:
            if not keep(f):
                continue
            lines = self.files[f].split("\n")
            lines = lines[:-1] if lines and lines[-1] == "" else lines
            hits = [n for n, line in enumerate(lines) if rx.search(line)]
            if a["mode"] == "content":
                out += [f"{f}:{n + 1}:{lines[n]}" for n in hits]  # (context lines are not scripted)
            elif hits:
                out.append(f if a["mode"] == "files" else f"{f}:{len(hits)}")
        return ExecResult("".join(line + "\n" for line in out), "", 0 if out else 1, duration)

    def _pytest(self, command: str, duration: float) -> ExecResult:
        targets = [w for w in command.split() if w.startswith("tests")] or ["tests"]
        files = [f for f in sorted(self.files) if f.startswith("tests/") and f.split("/")[-1].startswith("test_")]
        files = [f for f in files if any(f == t or f.startswith(t.rstrip("/") + "/") for t in targets)]
        tests = [(f, n) for f in files for n in re.findall(r"^\s*def (test_\w+)", self.files[f], re.M)]
        failing = next(((f, n) for f, n in tests if n == self.failing_test), None)
        self.failing_test = None
        lines = []
        for i, f in enumerate(files):
            marks = "".join("F" if (f, n) == failing else "." for g, n in tests if g == f)
            done = sum(1 for g, _ in tests if files.index(g) <= i)
            lines.append(f"{marks:<72} [{100 * done // max(1, len(tests)):>3}%]")
        summary = f"{len(tests) - bool(failing)} passed in {duration:.2f}s"
        if failing is None:
            return ExecResult("\n".join(lines + [summary]) + "\n", "", 0 if tests else 5, duration)
        f, name = failing
        assertion = _first_assert(self.files[f], name)
        failure = [
            " FAILURES ".center(80, "="),
            f" {name} ".center(80, "_"),
            "",
            f"    def {name}():",
            f">       {assertion}",
            "E       AssertionError",
            "",
            f"{f}:{_line_of(self.files[f], assertion)}: AssertionError",
            " short test summary info ".center(80, "="),
            f"FAILED {f}::{name} - AssertionError",
            f"1 failed, {summary}",
        ]
        return ExecResult("\n".join(lines + failure) + "\n", "", 1, duration)


def _glob_matcher(pattern: str | None):
    if not pattern:
        return lambda p: True
    return lambda p: fnmatch.fnmatchcase(p if "/" in pattern else p.rsplit("/", 1)[-1], pattern)


def _first_assert(source: str, test: str) -> str:
    m = re.search(rf"def {test}\(.*?\n((?:[ \t]+.*\n?|\n)*)", source)
    asserts = re.findall(r"^\s+(assert .+)$", m.group(1) if m else "", re.M)
    return asserts[0] if asserts else "assert result == expected"


def _line_of(source: str, text: str) -> int:
    i = source.find(text)
    return source.count("\n", 0, i) + 1 if i >= 0 else 1


def _run_now(coro: Any) -> Any:
    """Runs a coroutine that never really waits (the in-memory workspace answers at once)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a corpus tool call waited on something; the in-memory workspace must answer at once")


class _MemorySearch:
    """codebase_search over the in-memory files: the chunks that mention the most query words."""

    async def search(self, ws: _MemoryWorkspace, query: str, target_directories: list[str] | None, k: int):
        words = {w.lower() for w in re.findall(r"[A-Za-z]\w+", query)}
        hits = []
        for path, text in ws.files.items():
            lines = text.split("\n")
            for start in range(0, len(lines), 30):
                chunk = lines[start : start + 40]
                score = sum(w in line.lower() for line in chunk for w in words)
                if score and path.endswith(".py"):
                    best = max(range(len(chunk)), key=lambda n: (sum(w in chunk[n].lower() for w in words), -n))
                    first = max(0, best - 1)
                    symbol = next((f.name for f in _functions(text) if f.line <= start + best + 1 <= f.end), None)
                    snippet = "\n".join(line[:200] for line in chunk[first : first + 5])
                    hits.append(
                        SearchHit(path, start + 1, start + len(chunk), score, snippet, symbol, start + first + 1)
                    )
        return sorted(hits, key=lambda h: (-h.score, h.path, h.start_line))[:k]


# Phrasings, so the assistant's own text is not one sentence repeated.
_LOOK = [
    "I'll start by reading `{src}` and finding where `{fn}` is used.",
    "Let me look at `{fn}` and its callers first.",
    "First, the code: reading `{src}` and searching for `{fn}` in parallel.",
    "",
    "Let me find `{fn}` and the tests that cover it.",
    "Reading the module and grepping for usages.",
]
_TESTS = [
    "Now the tests that exercise `{fn}`.",
    "`{fn}` is at line {line} of `{src}`. Let me see how `{test}` uses it.",
    "",
    "Checking the existing tests before changing anything.",
]
_EDIT = [
    "The problem is on line {edit_line}: {why}. Fixing it.",
    "I'll make the smallest change: {why}.",
    "Found it: {why}.",
    "",
]
_VERIFY = [
    "Running the tests for this module and linting the change.",
    "Let me verify: tests and lints.",
    "",
    "Now checking that `{test}` passes.",
]
_RETRY = [
    "`{failing}` still fails. Let me read it again and adjust.",
    "One test fails: `{failing}`. The edit missed a case.",
]
_REQUESTS = {
    "fix": [
        "`{fn}` in {src} returns the wrong result in some cases; `{test}` fails. Please fix it.",
        "There's a bug in {fn} ({src}). Can you find it and fix it without touching the tests?",
        "fix the failing test in {test}",
        "After the last change `{fn}` misbehaves at the boundaries. Please look into it.",
    ],
    "feature": [
        "Make `{fn}` in {src} validate its input and raise a clear error on bad values.",
        "Please tidy up `{fn}`: name the intermediate result and keep the behaviour the same.",
    ],
    "test": [
        "Add a test for `{fn}` to {test}, following the style of the existing tests.",
        "{fn} has no test for the edge case; please add one in {test}.",
    ],
    "explain": [
        "How does `{fn}` in {src} work, and where is it used?",
        "Explain what {fn} does. Don't change anything.",
        "Where is `{fn}` called from? I want to understand the flow before refactoring.",
    ],
}
_FOLLOW_UPS = [
    "Thanks. Can you run the whole test suite to be sure?",
    "Great, please also run all the tests.",
    "ok, does the full suite still pass?",
]
_MUTATIONS = [
    (" <= ", " < "),
    (" < ", " <= "),
    (" >= ", " > "),
    (" > ", " >= "),
    (" == ", " != "),
    (" + 1", " - 1"),
    (" - 1", " + 1"),
    (" and ", " or "),
    ("not ", ""),
]


@dataclass(frozen=True)
class _Edit:
    line: int  # where the change is
    why: str
    calls: list[tuple[str, dict[str, Any]]]  # the edit_file calls
    summary: str  # the final answer's first sentence


@dataclass
class _Episode:
    """One scripted conversation: explore (parallel reads and searches), read the tests, edit, verify
    (tests and lints in parallel; sometimes a failure, a second look and a rerun), answer; sometimes
    a follow-up request. Tool results come from the real tools."""

    repo: _Repo
    rng: random.Random
    messages: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tools: dict[str, Tool] = tools_by_name(default_tools(_MemorySearch()))
        self.ws = _MemoryWorkspace(self.repo.files, self.rng)
        self.ctx = ToolContext(workspace=self.ws)  # type: ignore[arg-type]

    def say(self, options: list[str], **values: Any) -> str:
        return self.rng.choice(options).format(**values)

    def turn(self, content: str, calls: list[tuple[str, dict[str, Any]]]) -> list[ToolResult]:
        tool_calls = tuple(ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(calls))
        self.messages.append(Message("assistant", content, tool_calls))
        results = []
        for c in tool_calls:
            tool = self.tools[c.name]
            args = parse_args(tool, c.arguments)
            result = args if isinstance(args, ToolResult) else _run_now(tool.run(args, self.ctx))
            self.messages.append(Message("tool", result.text, tool_call_id=c.id, name=c.name))
            results.append(result)
        return results

    def run(self) -> list[Message]:
        r, repo = self.rng, self.repo
        src = r.choice(repo.sources)
        fn = r.choice(_functions(repo.files[src]))
        stem = src.rsplit("/", 1)[-1].removesuffix(".py")
        test = f"tests/test_{stem}.py" if f"tests/test_{stem}.py" in repo.files else r.choice(repo.tests)
        kind = r.choice(["fix", "fix", "fix", "feature", "test", "explain"])
        v = {"src": src, "fn": fn.name, "test": test, "line": fn.line}
        self.messages = [Message("system", SYSTEM_PROMPT), Message("user", self.say(_REQUESTS[kind], **v))]
        self.turn(self.say(_LOOK, **v), self.explore(kind, src, stem, fn))
        first_use = _line_of(repo.files[test], fn.name)
        read_test = {"path": test, "offset": max(1, first_use - r.randint(2, 8)), "limit": r.choice([30, 40, 60])}
        self.turn(self.say(_TESTS, **v), [("read_file", read_test if first_use > 1 else {"path": test})])
        if kind == "explain":
            users = [f for f in repo.files if f.endswith(".py") and re.search(rf"\b{fn.name}\b", repo.files[f])]
            self.messages.append(Message("assistant", _explanation(fn, src, users, test)))
            return self.messages

        edit = self.edit(kind, src, fn, test)
        self.turn(self.say(_EDIT, edit_line=edit.line, why=edit.why), edit.calls)
        test_names = re.findall(r"^\s*def (test_\w+)", self.ws.files[test], re.M)
        failing = r.choice(test_names) if r.random() < 0.3 and kind != "test" and test_names else None
        self.ws.failing_test = failing
        command = r.choice([f"python -m pytest -q {test}", f"pytest -q {test}", f"python -m pytest {test} -q"])
        verify = [
            ("run_terminal_cmd", {"command": command}),
            ("read_lints", {"paths": [test if kind == "test" else src]}),
        ]
        if r.random() < 0.2:
            verify.append(("run_terminal_cmd", {"command": "git diff"}))
        results = self.turn(self.say(_VERIFY, **v), verify if r.random() < 0.8 else verify[:1])
        if failing:
            reread = {"path": src, "offset": fn.line, "limit": fn.end - fn.line + 1}
            self.turn(self.say(_RETRY, failing=failing), [("read_file", reread)])
            results = self.turn("", [("run_terminal_cmd", {"command": command})])
        passed = re.search(r"(\d+) passed", results[0].text)
        self.messages.append(Message("assistant", f"{edit.summary} `{command}` passes ({passed.group(1)} passed)."))
        if r.random() < 0.25:
            self.messages.append(Message("user", r.choice(_FOLLOW_UPS)))
            res = self.turn("", [("run_terminal_cmd", {"command": "python -m pytest -q"})])[0]
            total = re.search(r"(\d+) passed", res.text)
            self.messages.append(Message("assistant", f"Yes: the full suite passes ({total.group(1)} tests)."))
        return self.messages

    def explore(self, kind: str, src: str, stem: str, fn: _Function) -> list[tuple[str, dict[str, Any]]]:
        """The first turn's calls, all at once: read the module, find the function's uses, look around."""
        r, name = self.rng, self.repo.name
        calls: list[tuple[str, dict[str, Any]]] = []
        if kind != "explain" and r.random() < 0.25:
            todos = [
                {"id": "1", "content": f"Read {fn.name} and its tests", "status": "in_progress"},
                {"id": "2", "content": f"Change {fn.name} in {src}"},
                {"id": "3", "content": "Run the tests"},
            ]
            calls.append(("todo_write", {"todos": todos}))
        if r.random() < 0.2:  # a guessed path that is not there
            calls.append(("read_file", {"path": f"src/{name}/{stem}.py"}))
        calls.append(("read_file", {"path": src}))
        grep: dict[str, Any] = {"pattern": rf"\b{fn.name}\b" if r.random() < 0.5 else f"{fn.name}\\("}
        if r.random() < 0.4:
            grep["output_mode"] = "files_with_matches"
        elif r.random() < 0.3:
            grep["glob"] = "*.py"
        calls.append(("grep", grep))
        if r.random() < 0.3:
            calls.append(("list_dir", {"path": r.choice([".", name, "tests"])}))
        if r.random() < 0.3:
            calls.append(("codebase_search", {"query": fn.name.replace("_", " "), "k": r.choice([3, 5])}))
        if r.random() < 0.2:
            calls.append(("glob_file_search", {"glob_pattern": r.choice(["test_*.py", "*.toml", f"{name}/*.py"])}))
        return calls

    def edit(self, kind: str, src: str, fn: _Function, test: str) -> _Edit:
        lines = self.repo.files[src].split("\n")
        if kind == "test":
            text = self.repo.files[test].rstrip("\n")
            tail = "\n".join(text.split("\n")[-2:])
            new = f"{tail}\n\n\ndef test_{fn.name}_edge_case():\n    assert {fn.name} is not None\n"
            call = ("edit_file", {"path": test, "old_string": tail, "new_string": new})
            why = f"a new test after the last one in {test}"
            return _Edit(text.count("\n") + 1, why, [call], f"I added `test_{fn.name}_edge_case` to `{test}`.")
        body = list(range(fn.body - 1, min(fn.end, len(lines))))  # 0-based indices
        for i in self.rng.sample(body, len(body)):
            prev, line = lines[i - 1], lines[i]
            for a, b in _MUTATIONS if kind == "fix" else ():
                if a in line and prev.strip() and not line.lstrip().startswith("#"):
                    new = f"{prev}\n{line.replace(a, b, 1)}"
                    why = (
                        f"`{line.strip()}` should not have `{a.strip()}`"
                        if not b.strip()
                        else f"`{a.strip()}` should be `{b.strip()}` in `{line.strip()}`"
                    )
                    call = ("edit_file", {"path": src, "old_string": f"{prev}\n{line}", "new_string": new})
                    return _Edit(i + 1, why, [call], f"I fixed `{fn.name}` in `{src}`: {why}.")
            m = re.match(r"(\s+)return (.+)$", line)
            if m and kind == "feature":
                indent, value = m.groups()
                new = f"{prev}\n{indent}result = {value}\n{indent}return result"
                call = ("edit_file", {"path": src, "old_string": f"{prev}\n{line}", "new_string": new})
                summary = f"I named the result of `{fn.name}` in `{src}`; behaviour is unchanged."
                return _Edit(i + 1, "name the returned value", [call], summary)
        before, anchor = lines[max(0, fn.body - 2)], lines[fn.body - 1]
        indent = re.match(r"\s*", anchor).group(0)  # type: ignore[union-attr]
        param = fn.params[0] if fn.params else "value"
        guard = f'{indent}if {param} is None:\n{indent}    raise ValueError("{fn.name}: {param} is required")'
        call = (
            "edit_file",
            {"path": src, "old_string": f"{before}\n{anchor}", "new_string": f"{before}\n{guard}\n{anchor}"},
        )
        summary = f"`{fn.name}` in `{src}` now raises ValueError when `{param}` is None."
        return _Edit(fn.body, f"`{fn.name}` must reject a missing `{param}`", [call], summary)


def _explanation(fn: _Function, src: str, users: list[str], test: str) -> str:
    doc = f" Its docstring says: {fn.doc}" if fn.doc else ""
    params = ", ".join(f"`{p}`" for p in fn.params) or "no arguments"
    others = [u for u in users if u != src]
    used = f"It is used in {', '.join(f'`{u}`' for u in others[:4])}." if others else "Nothing else calls it."
    return (
        f"`{fn.name}` is defined in `{src}` (lines {fn.line}-{fn.end}) and takes {params}.{doc}\n\n{used} "
        f"The behaviour is pinned down by `{test}`; I changed nothing."
    )
