"""Shell-backed tools: read_lints (ruff diagnostics) and run_terminal_cmd.

Both run inside the workspace through `workspace.exec`, with the workspace's own toolchain
and configuration (ruff reads the repository's pyproject.toml/ruff.toml). A command that
runs and fails (non-zero exit) is a normal result, not a tool error: only failing to run
it at all is an error.

Not covered: linters for other languages, and interactive or background commands (every
process a command starts ends with it, in the isolated backend).
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from pydantic import Field

from vivace.harness.tools.base import (
    EVERYTHING,
    MAX_RESULT_CHARS,
    MAX_RESULT_LINES,
    Access,
    ToolArgs,
    ToolContext,
    ToolResult,
    WorkspacePath,
    norm_path,
    truncate,
)
from vivace.harness.tools.files import EXPECTED, error
from vivace.harness.tools.search import rel_path
from vivace.sandbox.diff import header_path

LINT_TIMEOUT_S = 120.0
PY_SUFFIXES = (".py", ".pyi")
# `pwd` twice: ruff prints absolute paths under the physical cwd, which may differ from $PWD.
# A repository without a ruff configuration gets ruff's long-standing default rules (real
# errors: syntax, undefined names, unused imports) rather than the wider style set newer ruff
# releases enable, so results do not change with the ruff version and are not style noise.
DEFAULT_RULES = "E4,E7,E9,F"
_RUFF = (
    "pwd; pwd -P; command -v ruff >/dev/null 2>&1 || exit 127; "
    "if [ -f ruff.toml ] || [ -f .ruff.toml ] || grep -qs '^\\[tool\\.ruff' pyproject.toml; "
    'then exec ruff "$@"; fi; '
    f'sub=$1; shift; exec ruff "$sub" --select {DEFAULT_RULES} "$@"'
)


# -- read_lints -------------------------------------------------------------------------------------


class ReadLintsArgs(ToolArgs):
    paths: list[WorkspacePath] | None = Field(
        None,
        description="Python files or directories to check (workspace-relative); default: the Python files "
        "changed since the start of the task.",
    )


class ReadLints:
    name: ClassVar[str] = "read_lints"
    description: ClassVar[str] = (
        "Lint Python files with ruff, using the repository's own ruff configuration. Without paths, checks the "
        "Python files changed since the start of the task. Returns one `path:line:col: CODE message` per "
        "problem, sorted, and a count; other file types are ignored."
    )
    Args: ClassVar[type[ToolArgs]] = ReadLintsArgs

    def access(self, args: ReadLintsArgs) -> Access:
        if not args.paths:
            return Access(reads=frozenset({EVERYTHING}))
        return Access(reads=frozenset(norm_path(p) for p in args.paths))

    async def run(self, args: ReadLintsArgs, ctx: ToolContext) -> ToolResult:
        notes: list[str] = []
        if args.paths:
            targets = []
            for p in args.paths:
                rel = rel_path(p)
                if rel is None:
                    return error(f"path {p!r} is outside the workspace; use a path relative to the workspace root.")
                if "." in rel.rsplit("/", 1)[-1].lstrip(".") and not rel.endswith(PY_SUFFIXES):
                    notes.append(f"(ignored {rel}: read_lints checks Python files only)")
                elif rel not in targets:
                    if why := await _not_lintable(ctx, rel):
                        notes.append(f"(ignored {rel}: {why})")
                    else:
                        targets.append(rel)
            if not targets:
                return ToolResult(_lint_text(["No Python files to lint."] + notes, ctx))
        else:
            try:
                targets = _changed_python_files(await ctx.workspace.diff())
            except EXPECTED as e:
                return error(f"could not find the changed files: {e}; pass paths explicitly.")
            if not targets:
                return ToolResult(
                    "No Python files have changed since the start of the task; pass paths to lint others."
                )
        return await _lint(ctx, targets, notes)


def _changed_python_files(diff: str) -> list[str]:
    """Files added or modified (not deleted) in the workspace's diff, Python ones only. Read from the
    section headers, which name every file (`+++` lines are missing for binary and mode-only changes) and
    which quote names as git does."""
    out: list[str] = []
    path = None
    for line in diff.split("\n"):  # content lines start with " ", "+" or "-": never a header
        if line.startswith("diff --git "):
            path = header_path(line[len("diff --git ") :])
            if path and path.endswith(PY_SUFFIXES) and path not in out:
                out.append(path)
        elif line.startswith("deleted file mode ") and path in out:
            out.remove(path)  # a file that becomes a link is deleted, then added: its second section adds it back
    return sorted(out)


async def _not_lintable(ctx: ToolContext, rel: str) -> str | None:
    """Why ruff should not get `rel`, or None: a missing path (ruff reports it as a lint problem, E902),
    or a file without a .py suffix that is not a Python script (a Makefile, `bin/tool` in shell: ruff
    lints any file it is given as Python). A directory is linted for its Python files."""
    try:
        st = await ctx.workspace.stat(rel)
    except EXPECTED:
        return "no such file or directory"
    if st.kind == "dir" or rel.endswith(PY_SUFFIXES):
        return None
    try:
        head = (await ctx.workspace.read_bytes(rel))[:128] if st.size <= 1 << 20 else b""
    except EXPECTED:
        head = b""
    first = head.split(b"\n", 1)[0]
    return None if first.startswith(b"#!") and b"python" in first else "not a Python file"


async def _lint(ctx: ToolContext, targets: list[str], notes: list[str]) -> ToolResult:
    argv = ["check", "--output-format", "json", "--no-cache", "--exit-zero", "--force-exclude", "--", *targets]
    try:
        res = await ctx.workspace.exec(["sh", "-c", _RUFF, "sh", *argv], timeout=LINT_TIMEOUT_S)
    except EXPECTED as e:
        return error(f"ruff could not run in the workspace: {e}")
    if res.exit_code == 127:
        return error("ruff is not installed in the workspace's environment; run a linter with run_terminal_cmd.")
    cwd, _, rest = res.stdout.partition("\n")
    real, _, payload = rest.partition("\n")
    try:
        diagnostics = json.loads(payload) if res.exit_code == 0 else None
    except json.JSONDecodeError:
        diagnostics = None
    if not isinstance(diagnostics, list):
        msg = (res.stderr.strip() or payload.strip())[-2000:]
        return error(f"ruff failed (exit code {res.exit_code}): {msg or 'no output'}")
    rows = sorted(_row(d, (cwd, real)) for d in diagnostics)
    files = {r[0] for r in rows}
    shown = ", ".join(targets[:10]) + (f" and {len(targets) - 10} more" if len(targets) > 10 else "")
    if not rows:
        return ToolResult(
            _lint_text([f"No lint errors in {shown}."] + notes, ctx), meta={"problems": 0, "diagnostics": []}
        )
    lines = [f"{path}:{line}:{col}: {code} {msg}" for path, line, col, code, msg in rows]
    lines.append(f"{len(rows)} problem(s) in {len(files)} file(s).")
    return ToolResult(
        _lint_text(lines + notes, ctx), meta={"problems": len(rows), "files": len(files), "diagnostics": rows}
    )


def _lint_text(lines: list[str], ctx: ToolContext) -> str:
    """The result's lines under the one truncation rule (2,000 ignored paths made 93,000 characters of notes)."""
    return truncate("\n".join(lines) + "\n", ctx.max_result_chars, hint="lint fewer paths at a time").rstrip("\n")


def _row(d: dict, roots: tuple[str, str]) -> tuple[str, int, int, str, str]:
    path = str(d.get("filename", "?"))
    for root in roots:
        if root and path.startswith(root.rstrip("/") + "/"):
            path = path[len(root.rstrip("/")) + 1 :]
            break
    loc = d.get("location") or {}
    return path, int(loc.get("row", 0)), int(loc.get("column", 0)), str(d.get("code") or "error"), str(d.get("message"))


# -- run_terminal_cmd -------------------------------------------------------------------------------


class RunTerminalCmdArgs(ToolArgs):
    command: str = Field(description="A bash command line, run in the workspace root.")
    timeout_s: float | None = Field(
        None, ge=1, le=600, description="Seconds before the command is killed (default: the task's default)."
    )


class RunTerminalCmd:
    name: ClassVar[str] = "run_terminal_cmd"
    description: ClassVar[str] = (
        "Run a bash command in the workspace root (non-interactive; no process outlives the command). Returns "
        "`Exit code: N` (and whether it timed out or ran out of memory), then `--- stdout ---` and "
        "`--- stderr ---` sections when non-empty; long output keeps its beginning and end. A non-zero exit "
        "code is reported, not treated as a tool error."
    )
    Args: ClassVar[type[ToolArgs]] = RunTerminalCmdArgs

    def access(self, args: RunTerminalCmdArgs) -> Access:
        return Access(writes=frozenset({EVERYTHING}))

    async def run(self, args: RunTerminalCmdArgs, ctx: ToolContext) -> ToolResult:
        if not args.command.strip():
            return error("command is empty; give a bash command line.")
        timeout = args.timeout_s or ctx.command_timeout_s
        try:
            env = {"PYTHONHASHSEED": "0"} if ctx.reproducible_output else None
            res = await ctx.workspace.exec(args.command, timeout=timeout, env=env)
        except EXPECTED as e:
            return error(f"the command could not be run: {e}")
        head = f"Exit code: {res.exit_code}"
        if res.timed_out:
            head += f" (timed out after {timeout:g} s; the command was killed)"
        if res.oom_killed:
            head += " (killed: out of memory)"
        streams = [("stdout", res.stdout, res.stdout_dropped), ("stderr", res.stderr, res.stderr_dropped)]
        if ctx.reproducible_output:
            streams = [(name, steady(text), dropped) for name, text, dropped in streams]
        streams = [st for st in streams if st[1] or st[2]]
        parts = [head] + [_section(*st, budget=ctx.max_result_chars // max(1, len(streams))) for st in streams]
        meta = {"exit_code": res.exit_code, "timed_out": res.timed_out, "duration_s": res.duration_s}
        return ToolResult("\n".join(parts), meta=meta)


# "in 0.16s" (pytest), "in 0.002s" (unittest), "in 61.02s (0:01:01)" (pytest, a minute or more).
_DURATION = re.compile(r"\bin (\d+)\.(\d+)s\b(?: \(\d+:\d\d:\d\d\))?")


# An object's address in its repr (`<Circle object at 0x7f9b25b6ccd0>`, `<function f at 0x...>`): new each run.
_ADDRESS = re.compile(r"\bat 0x([0-9a-fA-F]{6,16})\b")


def steady(text: str) -> str:
    """The text with what differs between two runs of one command written as one fixed value: durations as
    `in 0.10s` (as many decimals as the original), addresses in reprs as `at 0x7f00…` (as many digits)."""
    text = _DURATION.sub(lambda m: "in 0." + "1".ljust(len(m.group(2)), "0") + "s", text)
    return _ADDRESS.sub(lambda m: "at 0x" + "7f".ljust(len(m.group(1)), "0"), text)


def _section(name: str, text: str, dropped: int, budget: int) -> str:
    """One output stream under its header, in `budget` characters (two streams split the one result budget)."""
    note = f" (the sandbox dropped {dropped} bytes in the middle)" if dropped else ""
    hint = f"redirect {name} to a file and read or grep it"
    body = truncate(text, budget, max(1, MAX_RESULT_LINES * budget // MAX_RESULT_CHARS), hint=hint)
    return f"--- {name}{note} ---\n" + body.rstrip("\n")
