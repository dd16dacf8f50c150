"""The agent's tools, in the order the model sees them:

- read_file: numbered lines of a text file (offset/limit for ranges)
- edit_file: exact string replacement (whitespace-tolerant fallback; empty old_string creates)
- write_file: create or overwrite a whole file
- delete_file: remove a file or symlink
- list_dir: one directory's entries
- glob_file_search: files by name pattern
- grep: regex search of file contents (ripgrep, or an identical built-in fallback)
- codebase_search: ranked code search (a pluggable SearchBackend; the hybrid semantic index by default)
- read_lints: ruff diagnostics for changed or given Python files
- run_terminal_cmd: a bash command in the workspace
- todo_write: the agent's task list

Every tool follows the protocol in base.py: declared arguments, declared accesses (for
parallel execution), error results instead of exceptions, and one truncation rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from vivace.harness.tools.base import Tool
from vivace.harness.tools.files import DeleteFile, EditFile, ListDir, ReadFile, WriteFile
from vivace.harness.tools.search import CodebaseSearch, GlobFileSearch, Grep, LexicalSearch, SearchBackend, SearchHit
from vivace.harness.tools.shell import ReadLints, RunTerminalCmd
from vivace.harness.tools.todo import TodoWrite

__all__ = ["LexicalSearch", "SearchBackend", "SearchHit", "Tool", "default_tools", "tools_by_name"]


def default_tools(search_backend: SearchBackend | None = None) -> list[Tool]:
    """Fresh instances of every tool; `search_backend` overrides codebase_search's (else the
    episode's `ctx.search`, else the process-wide hybrid index)."""
    return [
        ReadFile(),
        EditFile(),
        WriteFile(),
        DeleteFile(),
        ListDir(),
        GlobFileSearch(),
        Grep(),
        CodebaseSearch(search_backend),
        ReadLints(),
        RunTerminalCmd(),
        TodoWrite(),
    ]


def tools_by_name(tools: Iterable[Tool]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}
