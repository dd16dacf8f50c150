"""Search tools: grep, glob_file_search and codebase_search.

Searches run INSIDE the workspace through `workspace.exec` with argv lists, so they work the
same for local, isolated and remote (HTTP) workspaces and never read the host's copy of a
file. grep uses ripgrep when the workspace has it and otherwise a built-in Python walker
(`_WALKER`, run with `python3 -c`) that prints the same format for the same inputs: hidden
files and directories, symlinks and binary files are skipped and .gitignore is honoured in
git repositories (through `git ls-files`, or the walker's own reading of .gitignore where git
cannot run), as rg does by default; a path named explicitly is searched even when ignored, and
followed when it is a symlinked directory inside the workspace. `$` matches before a CRLF
ending in both (rg --crlf). The walker also lists files for glob_file_search and reads files
for codebase_search's lexical index. A search that runs past SEARCH_TIMEOUT_S is killed; what
it printed by then is kept and marked incomplete.

Known differences between rg and the walker: regex dialects (Rust vs Python `re`; their
error messages differ too), `.ignore`/`.rgignore` files (rg only), files that are tracked
but gitignored (the walker lists them), NUL bytes after rg's first buffer, and a path that is a
symlink leading outside the workspace (rg follows it; the walker refuses it, as glob does).

codebase_search goes through the small `SearchBackend` protocol. The default is the semantic
index (`vivace.search.backend.HybridSearch`: tree-sitter chunks, embeddings fused with BM25,
one process-wide instance so a snapshot is indexed once for all its workspaces);
`LexicalSearch` (BM25 over ~40-line chunks, no model) stays available as a backend.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import posixpath
import re
import weakref
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from re import _parser as sre_parse  # the parser Python's re compiles with (3.11+)
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field, field_validator

from vivace.harness.tools.base import (
    EVERYTHING,
    Access,
    ToolArgs,
    ToolContext,
    ToolResult,
    WorkspacePath,
    truncate,
)
from vivace.harness.tools.files import EXPECTED, MAX_LINE_CHARS, error
from vivace.sandbox.base import PathEscapeError, SandboxError, SymlinkLoop, Workspace
from vivace.sandbox.paths import WORKSPACE_MOUNT
from vivace.search.lexical import import_bm25s, tokenize
from vivace.search.types import SearchHit, quote_query

SEARCH_TIMEOUT_S = 60.0
MAX_PATTERN_CHARS = 4_096  # grep and glob patterns: rg took 7 s on a 30,000-character literal, over 60 s on 100,000
MAX_GLOB_RESULTS = 200
MAX_INDEX_FILES, MAX_INDEX_FILE_BYTES = 5_000, 1_000_000
CHUNK_LINES, CHUNK_OVERLAP = 40, 10
READ_BUDGET = 150_000  # characters of encoded file content per exec, under the sandbox's output cap
_EVERYTHING = Access(reads=frozenset({EVERYTHING}))

# The walker runs as `python3 -c SOURCE ARGS_JSON [PATHS...]` inside the workspace (see walker.py).
_WALKER = (Path(__file__).parent / "walker.py").read_text()

_RG = 'command -v rg >/dev/null 2>&1 || exit 127; exec rg "$@"'  # 127: no rg here, use the walker


def rel_path(path: str) -> str | None:
    """A workspace-relative spelling of `path` for search commands; None when it leaves the workspace."""
    p = path.strip() or "."
    if p == WORKSPACE_MOUNT or p.startswith(WORKSPACE_MOUNT + "/"):
        p = p[len(WORKSPACE_MOUNT) :].lstrip("/") or "."
    if p.startswith("/"):
        return None
    p = posixpath.normpath(p)
    return None if p == ".." or p.startswith("../") else p


async def _leads_outside(ws: Workspace, path: str) -> bool:
    """Whether `path` is a symlink (or passes one) leading outside the workspace. rg follows a path
    named explicitly, so it is checked here, through the workspace's confined file API. A remote
    workspace has no such call, and there rg still follows it (inside the isolated sandbox that
    reaches only the sandbox's own files)."""
    realpath = getattr(ws, "realpath", None)
    if path == "." or not callable(realpath):
        return False
    try:
        await realpath(path)
    except SymlinkLoop:  # inside, and rg names the loop itself
        return False
    except PathEscapeError:
        return True
    except (SandboxError, OSError):  # missing or unreadable: rg reports it as before
        return False
    return False


def _outside(path: str) -> ToolResult:
    return error(f"path {path!r} is outside the workspace; use a path relative to the workspace root.")


async def _walker(ws: Workspace, args: dict[str, Any], paths: list[str] | None = None) -> Any:
    return await ws.exec(
        ["python3", "-c", _WALKER, json.dumps(args | {"max_columns": MAX_LINE_CHARS}), *(paths or [])],
        timeout=SEARCH_TIMEOUT_S,
    )


class _PerWorkspace(dict):
    """Per-workspace cache; weak where the workspace allows it, so closed workspaces drop out."""

    def __init__(self) -> None:
        super().__init__()
        self.weak: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_for(self, ws: Any) -> Any:
        try:
            return self.weak.get(ws)
        except TypeError:
            return self.get(id(ws))

    def set_for(self, ws: Any, value: Any) -> None:
        try:
            self.weak[ws] = value
        except TypeError:
            self[id(ws)] = value


# -- grep -------------------------------------------------------------------------------------------


def short_pattern(pattern: str) -> str:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"the pattern has {len(pattern)} characters, over the limit of {MAX_PATTERN_CHARS}; search for a "
                         "shorter, distinctive part")  # fmt: skip
    return pattern


class GrepArgs(ToolArgs):
    @field_validator("pattern")
    @classmethod
    def _short_pattern(cls, pattern: str) -> str:
        return short_pattern(pattern)

    # Limits are checked by validators, not Field constraints: those would show in the tool's schema, and
    # change the system prompt the shipped policy was trained with.
    pattern: str = Field(description="Regular expression to search for (ripgrep syntax).")
    path: WorkspacePath = Field(".", description="File or directory to search, relative to the workspace root.")
    glob: str | None = Field(None, description="Only search files matching this glob, e.g. '*.py' or 'src/**/*.ts'.")
    output_mode: Literal["content", "files_with_matches", "count"] = Field(
        "content", description="content: matching lines; files_with_matches: file paths; count: matches per file."
    )
    context_before: int | None = Field(None, ge=0, description="Lines of context before each match (content mode).")
    context_after: int | None = Field(None, ge=0, description="Lines of context after each match (content mode).")
    context: int | None = Field(None, ge=0, description="Lines of context before and after each match.")
    case_insensitive: bool = Field(False, description="Match regardless of case.")
    head_limit: int | None = Field(None, ge=1, description="Show only the first N output lines.")


class Grep:
    name: ClassVar[str] = "grep"
    description: ClassVar[str] = (
        "Search file contents with a regular expression (ripgrep). Skips hidden, gitignored and binary files. "
        "content mode prints `path:line:text` for matches and `path-line-text` for context lines (`--` between "
        "groups); files_with_matches prints one path per line; count prints `path:N` (matching lines). Paths "
        "are workspace-relative, sorted. Long output is truncated; use glob, path or head_limit to narrow it."
    )
    Args: ClassVar[type[ToolArgs]] = GrepArgs

    def __init__(self, use_rg: bool | None = None):
        self.use_rg = use_rg  # None: rg when the workspace has it; False forces the walker (tests)
        self._has_rg = _PerWorkspace()

    def access(self, args: GrepArgs) -> Access:
        return _EVERYTHING  # repo-wide: ordered after every write of the same turn

    async def run(self, args: GrepArgs, ctx: ToolContext) -> ToolResult:
        path = rel_path(args.path)
        if path is None or await _leads_outside(ctx.workspace, path):
            return _outside(args.path)
        before = args.context_before if args.context_before is not None else (args.context or 0)
        after = args.context_after if args.context_after is not None else (args.context or 0)
        if args.output_mode != "content":
            before = after = 0
        try:
            res = await self._search(ctx.workspace, args, path, before, after)
        except EXPECTED as e:
            return error(f"grep could not run in the workspace: {e}")
        if isinstance(res, ToolResult):
            return res
        stdout = res.stdout
        if res.timed_out and not stdout.endswith("\n"):
            stdout = stdout[: stdout.rfind("\n") + 1]  # the line being written when the search was killed
        if res.timed_out and not stdout.strip():
            return error(f"grep timed out after {SEARCH_TIMEOUT_S:g} s with no results yet; {_NARROW}.")
        if res.exit_code == 1 and not res.stdout and not res.stderr.strip():  # a failure that exits 1 says why
            return ToolResult(f"No matches for {args.pattern!r} in {path}.")
        if res.exit_code != 0 and not res.stdout.strip():
            msg = res.stderr.strip()
            if f"{path}: No such file or directory" in msg:
                return error(f"{path} does not exist; use list_dir or glob_file_search to find the right path.")
            if f"{path}: is outside the workspace" in msg:
                return _outside(args.path)
            if "regex parse error" in msg:
                return error(f"invalid regular expression {args.pattern!r}: {msg}")
            return error(f"grep failed (exit code {res.exit_code}): {msg or 'no message'}")
        # Split on \n only: a matched line may hold \r or form feeds that splitlines() would break apart.
        lines = [line.removeprefix("./").removesuffix("\r") for line in stdout.split("\n")]
        lines = lines[:-1] if lines and lines[-1] == "" else lines
        timed_out = SEARCH_TIMEOUT_S if res.timed_out else None
        return ToolResult(_finish(lines, args.head_limit, res.stdout_dropped, ctx.max_result_chars, timed_out))

    async def _search(self, ws: Workspace, args: GrepArgs, path: str, before: int, after: int) -> Any:
        use_rg = self.use_rg if self.use_rg is not None else self._has_rg.get_for(ws)
        if use_rg is not False:
            # One exec both checks for rg and searches (each exec may cost a network round trip).
            res = await ws.exec(["sh", "-c", _RG, "sh", *_rg_args(args, path, before, after)], timeout=SEARCH_TIMEOUT_S)
            if res.exit_code != 127:
                self._has_rg.set_for(ws, True)
                return res
            self._has_rg.set_for(ws, False)
        if nested_repeat(args.pattern):
            return error(
                f"this workspace has no ripgrep, and the Python regex engine grep falls back on can take "
                f"exponential time on a repeated group that holds a repeat, as in {args.pattern[:100]!r}; rewrite "
                "the pattern without nested quantifiers (e.g. `a+` for `(a+)+`, or `(ab)+` for `(a+b)+`) or grep "
                "for a literal part of it."
            )
        mode = {"files_with_matches": "files"}.get(args.output_mode, args.output_mode)
        spec = {"pattern": args.pattern, "path": path, "glob": args.glob, "mode": mode}
        spec |= {"before": before, "after": after, "ignore_case": args.case_insensitive}
        return await _walker(ws, spec)


_REPEATS = (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT)


def nested_repeat(pattern: str, tree: Any = None, inside: bool = False) -> bool:
    """Whether a regex repeats a group that itself holds a repeat of varying length (`(a+)+$`, `(x+x+)+y`,
    `(\\w*)*`): the shape on which Python's backtracking re takes exponential time (on a 41-character line,
    `(a+)+$` ran past the 60 s timeout). Fixed counts (`(ab{2})+`) pass. Other exponential shapes, such as
    overlapping alternatives (`(a|a)+`), are not caught: the search timeout still ends those. A pattern that
    does not parse passes too: the walker reports the error."""
    if tree is None:
        try:
            tree = sre_parse.parse(pattern)
        except (re.error, RecursionError, OverflowError):
            return False
    for op, av in tree:
        if op in _REPEATS and av[0] != av[1] and av[1] > 1:
            if inside or nested_repeat(pattern, av[2], True):
                return True
        elif any(nested_repeat(pattern, sub, inside) for sub in _subpatterns(av)):
            return True
    return False


def _subpatterns(av: Any) -> list[Any]:
    """The parsed sub-patterns in one node's argument (a group's body, a branch's alternatives, ...)."""
    if isinstance(av, sre_parse.SubPattern):
        return [av]
    return [sub for x in av for sub in _subpatterns(x)] if isinstance(av, (tuple, list)) else []


def _rg_args(args: GrepArgs, path: str, before: int, after: int) -> list[str]:
    argv = ["--no-config", "--no-heading", "--with-filename", "--line-number", "--color", "never", "--sort", "path"]
    argv.append("--crlf")  # `$` matches before \r\n too, as a model reading the file expects
    # A minified file's one matching line can be megabytes: cut it in rg, before it fills the sandbox's
    # output cap and pushes other files' matches out (the walker cuts the same way).
    argv += ["--max-columns", str(MAX_LINE_CHARS), "--max-columns-preview"]
    argv += {"files_with_matches": ["--files-with-matches"], "count": ["--count"]}.get(args.output_mode, [])
    if before:
        argv += ["-B", str(before)]
    if after:
        argv += ["-A", str(after)]
    if args.case_insensitive:
        argv.append("-i")
    if args.glob:
        argv += ["-g", args.glob]
    return argv + ["-e", args.pattern, "--", path]


_NARROW = "narrow the path or glob, or simplify the pattern"


def _finish(lines: list[str], head_limit: int | None, dropped: int, budget: int, timed_out: float | None = None) -> str:
    """Output lines with head_limit applied, long lines cut, then the one truncation rule."""
    notes = []
    if timed_out is not None:
        notes.append(f"[grep timed out after {timed_out:g} s: the results above are incomplete; {_NARROW}]")
    if head_limit is not None and len(lines) > head_limit:
        notes.append(f"[{len(lines) - head_limit} more lines not shown (head_limit={head_limit})]")
        lines = lines[:head_limit]
    if dropped:
        notes.append(f"[the sandbox dropped {dropped} more bytes of output; narrow the search]")
    lines = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [... line cut]" for line in lines]
    text = truncate("\n".join(lines + notes) + "\n", budget, hint="narrow the pattern, path or glob, or use head_limit")
    return text.rstrip("\n")


# -- glob_file_search -------------------------------------------------------------------------------


class GlobArgs(ToolArgs):
    @field_validator("glob_pattern")
    @classmethod
    def _short_pattern(cls, pattern: str) -> str:
        return short_pattern(pattern)

    glob_pattern: str = Field(
        description="Glob such as '*.py' (no '/': matches file names at any depth), 'src/**/*.ts' or 'tests/test_*.py'."
    )
    path: WorkspacePath = Field(".", description="Directory to search, relative to the workspace root.")


class GlobFileSearch:
    name: ClassVar[str] = "glob_file_search"
    description: ClassVar[str] = (
        "Find files by name with a glob (`*`, `?`, `[abc]`, `{a,b}`, `**` for any depth; a pattern without `/` "
        "matches file names at any depth). Returns workspace-relative paths, one per line, sorted; at most "
        f"{MAX_GLOB_RESULTS} are listed with a count of the rest. Hidden and gitignored files are skipped."
    )
    Args: ClassVar[type[ToolArgs]] = GlobArgs

    def access(self, args: GlobArgs) -> Access:
        return _EVERYTHING

    async def run(self, args: GlobArgs, ctx: ToolContext) -> ToolResult:
        path = rel_path(args.path)
        if path is None:
            return _outside(args.path)
        try:
            res = await _walker(ctx.workspace, {"mode": "glob", "glob": args.glob_pattern, "path": path,
                                                "limit": MAX_GLOB_RESULTS})  # fmt: skip
        except EXPECTED as e:
            return error(f"glob_file_search could not run in the workspace: {e}")
        msg = res.stderr.strip()
        if res.timed_out:
            return error(f"glob_file_search timed out after {SEARCH_TIMEOUT_S:g} s; use a narrower path.")
        if res.exit_code != 0:
            if f"{path}: No such file or directory" in msg:
                return error(f"directory {path} does not exist; use list_dir to find the right path.")
            if f"{path}: is outside the workspace" in msg:
                return _outside(args.path)
            return error(f"glob_file_search failed (exit code {res.exit_code}): {msg[-2000:]}")
        found = [p for p in res.stdout.split("\n") if p]
        # The walker prints the first MAX_GLOB_RESULTS paths and then "\0COUNT": a full list overflowed
        # the output cap past about 256 KiB, and its cut-off head was counted (50,000 files as 13,800).
        total = int(found.pop()[1:]) if found and found[-1][:1] == "\0" else len(found)
        if not found and msg.endswith("is a file"):
            return error(f"{path} is a file, not a directory, and does not match {args.glob_pattern!r}.")
        if not found:
            return ToolResult(f"No files match {args.glob_pattern!r} in {path}.")
        shown = found[:MAX_GLOB_RESULTS]
        if total > len(shown):
            shown.append(f"[... and {total - len(shown)} more files; use a narrower pattern or path]")
        text = truncate("\n".join(shown) + "\n", ctx.max_result_chars, hint="use a narrower pattern or path")
        return ToolResult(text.rstrip("\n"))


# -- codebase_search --------------------------------------------------------------------------------


class SearchBackend(Protocol):
    async def search(
        self, workspace: Workspace, query: str, target_directories: list[str] | None, k: int
    ) -> list[SearchHit]: ...


_DEF = re.compile(
    r"^\s*(?:export\s+)?(?:pub(?:\([\w:]+\))?\s+)?(?:async\s+)?"
    r"(?:def|class|function|func|fn|struct|interface|enum|trait)\s+([A-Za-z_]\w*)"
)


@dataclass
class _Chunk:
    path: str
    start: int  # 1-based first line
    lines: list[str]
    symbol: str | None


@dataclass
class _Index:
    listing: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (size, mtime_ns)
    chunks_by_path: dict[str, list[_Chunk]] = field(default_factory=dict)
    tokens_by_path: dict[str, list[list[str]]] = field(default_factory=dict)
    chunks: list[_Chunk] = field(default_factory=list)
    bm25: Any = None


def _chunk(path: str, text: str) -> list[_Chunk]:
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if not lines:
        return []
    defs = [(n, m.group(1)) for n, line in enumerate(lines) if (m := _DEF.match(line))]
    out, step = [], CHUNK_LINES - CHUNK_OVERLAP
    for start in range(0, max(1, len(lines) - CHUNK_OVERLAP), step):
        end = min(len(lines), start + CHUNK_LINES)
        inside = [name for n, name in defs if start <= n < end]
        enclosing = [name for n, name in defs if n < start]
        symbol = inside[0] if inside else (enclosing[-1] if enclosing else None)
        out.append(_Chunk(path, start + 1, lines[start:end], symbol))
    return out


class LexicalSearch:
    """BM25 over ~40-line chunks of the workspace's text files, kept per workspace and
    refreshed from a cheap listing (path, size, mtime) on every query, so only changed files
    are read again and an edit is searchable at once."""

    def __init__(self) -> None:
        self._indexes = _PerWorkspace()
        self._lock = asyncio.Lock()

    async def search(
        self, workspace: Workspace, query: str, target_directories: list[str] | None, k: int
    ) -> list[SearchHit]:
        async with self._lock:  # two searches in one turn: the second reuses the first's refresh
            index = await self._refresh(workspace)
        terms = tokenize(query)
        if not terms or not index.chunks:
            return []
        scores = index.bm25.get_scores(terms)
        dirs = [d for d in (rel_path(t) for t in target_directories or []) if d is not None and d != "."]
        hits: list[SearchHit] = []
        for i in scores.argsort()[::-1]:
            chunk, score = index.chunks[i], float(scores[i])
            if score <= 0 or len(hits) >= k:
                break
            if dirs and not any(chunk.path == d or chunk.path.startswith(d + "/") for d in dirs):
                continue
            end = chunk.start + len(chunk.lines) - 1
            if any(h.path == chunk.path and h.start_line <= end and chunk.start <= h.end_line for h in hits):
                continue  # overlaps a better chunk of the same file
            hits.append(_hit(chunk, end, score, set(terms)))
        return hits

    async def _refresh(self, ws: Workspace) -> _Index:
        index = self._indexes.get_for(ws) or _Index()
        res = await _walker(ws, {"mode": "list", "max_files": MAX_INDEX_FILES, "max_bytes": MAX_INDEX_FILE_BYTES})
        if res.exit_code != 0 or res.stdout_dropped:
            raise OSError(f"listing the workspace failed: {res.stderr.strip()[-500:] or 'output too large'}")
        listing = {p: (size, mtime) for p, size, mtime in json.loads(zlib.decompress(base64.b64decode(res.stdout)))}
        if index.bm25 is not None and listing == index.listing:
            return index
        changed = [p for p, key in listing.items() if index.listing.get(p) != key]
        for path, text in (await _read_files(ws, changed)).items():
            index.chunks_by_path[path] = _chunk(path, text) if text is not None else []
            path_tokens = tokenize(path)
            index.tokens_by_path[path] = [
                path_tokens + tokenize("\n".join(c.lines)) for c in index.chunks_by_path[path]
            ]
        for gone in set(index.chunks_by_path) - set(listing):
            del index.chunks_by_path[gone], index.tokens_by_path[gone]
        index.listing = listing
        index.chunks = [c for p in sorted(index.chunks_by_path) for c in index.chunks_by_path[p]]
        index.bm25 = import_bm25s().BM25()  # deferred: only episodes that search pay for the import
        corpus = [t for p in sorted(index.tokens_by_path) for t in index.tokens_by_path[p]]
        if corpus:
            index.bm25.index(corpus, show_progress=False)
        self._indexes.set_for(ws, index)
        return index


async def _read_files(ws: Workspace, paths: list[str]) -> dict[str, str | None]:
    """Contents of `paths` (None for binary or oversized ones), in as few execs as the output cap allows."""
    out: dict[str, str | None] = {}
    budget = READ_BUDGET
    while paths:
        res = await _walker(ws, {"mode": "read", "budget": budget}, paths)
        if res.stdout_dropped and budget > 4_000:
            budget //= 2  # the sandbox keeps less output than we assumed: ask for smaller batches
            continue
        if res.exit_code != 0 or res.stdout_dropped:
            raise OSError(f"reading files for the index failed: {res.stderr.strip()[-500:]}")
        got = json.loads(res.stdout)
        for p, blob in got["files"].items():
            out[p] = None if blob is None else zlib.decompress(base64.b64decode(blob)).decode("utf-8", "replace")
        paths = got["rest"]
    return out


def _hit(chunk: _Chunk, end: int, score: float, terms: set[str]) -> SearchHit:
    """A hit whose snippet starts just before the chunk's line sharing the most query terms."""
    overlap = [len(terms & set(tokenize(line))) for line in chunk.lines]
    best = max(range(len(overlap)), key=lambda n: (overlap[n], -n)) if overlap else 0
    first = max(0, best - 1)
    snippet = "\n".join(line[:200] for line in chunk.lines[first : first + 5])
    return SearchHit(chunk.path, chunk.start, end, score, snippet, chunk.symbol, chunk.start + first)


class IndexNotReady(Exception):
    """A search backend's index of the workspace is still being built (its first search of a large
    workspace embeds every file); codebase_search then answers by terms (LexicalSearch)."""


@functools.cache
def _lexical_fallback() -> LexicalSearch:
    """The term-matching search codebase_search answers with while the semantic index is being built."""
    return LexicalSearch()


def default_search_backend() -> SearchBackend:
    """The process-wide semantic index (shared by every episode); imported on first use, so
    episodes that never search never load the embedding model."""
    from vivace.search.backend import default_backend

    return default_backend()


class CodebaseSearchArgs(ToolArgs):
    query: str = Field(description="What to look for: identifiers, words, or a description of the code.")
    target_directories: list[str] | None = Field(
        None, description="Only search under these directories (workspace-relative); default: everywhere."
    )
    k: int = Field(10, ge=1, le=50, description="Maximum number of results.")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, query: str) -> str:
        if not query.strip():
            raise ValueError("the query is empty; say what to look for (identifiers, words or a description)")
        return query


class CodebaseSearch:
    name: ClassVar[str] = "codebase_search"
    description: ClassVar[str] = (
        "Search the codebase for the code most relevant to a query, by meaning and by terms (semantic "
        "embeddings fused with term matching over functions, classes and other chunks; identifiers are matched "
        "whole and split into words). Returns up to k hits, best first, each as `path:start-end (symbol)` "
        "followed by a few lines. Use grep for exact patterns."
    )
    Args: ClassVar[type[ToolArgs]] = CodebaseSearchArgs

    def __init__(self, backend: SearchBackend | None = None):
        self.backend = backend

    def access(self, args: CodebaseSearchArgs) -> Access:
        return _EVERYTHING

    async def run(self, args: CodebaseSearchArgs, ctx: ToolContext) -> ToolResult:
        missing = await _missing_dirs(ctx.workspace, args.target_directories or [])
        if missing:
            return error(missing)
        backend = self.backend or ctx.search
        if backend is None:
            backend = ctx.search = default_search_backend()
        note = ""
        try:
            try:
                hits = await backend.search(ctx.workspace, args.query, args.target_directories, args.k)
            except IndexNotReady as e:  # its build goes on, for a later search
                note = f"({e}: these are term matches only. Search again later for results by meaning.)\n\n"
                hits = await _lexical_fallback().search(ctx.workspace, args.query, args.target_directories, args.k)
        except (*EXPECTED, ValueError, zlib.error) as e:  # ValueError, zlib.error: garbled walker output
            return error(f"codebase_search failed: {e}; try grep instead.")
        if not hits:
            return ToolResult(f"{note}No results for {quote_query(args.query)}.")
        text = note + "\n\n".join(_render(h) for h in hits) + "\n"
        text = truncate(text, ctx.max_result_chars, hint="lower k or narrow the query")
        return ToolResult(text.rstrip("\n"))


async def _missing_dirs(ws: Workspace, dirs: list[str]) -> str | None:
    """Why target_directories cannot be searched (they are not there); None when they can. Entries outside
    the workspace are left to the backend, which skips them."""
    gone = []
    for p in (rel_path(d) for d in dirs):
        if p is None or p == ".":
            continue
        try:
            await ws.stat(p)
        except FileNotFoundError:  # WorkspaceFileNotFound is one
            gone.append(p)
        except EXPECTED:
            pass  # the search itself reports a workspace that cannot answer
    if not gone:
        return None
    what = f"target directory {gone[0]!r} does not" if len(gone) == 1 else f"target directories {gone} do not"
    return f"{what} exist; use list_dir to find the right path."


def _render(hit: SearchHit) -> str:
    head = f"{hit.path}:{hit.start_line}-{hit.end_line}" + (f" ({hit.symbol})" if hit.symbol else "")
    first = hit.snippet_line or hit.start_line
    lines = [line.removesuffix("\r") for line in hit.snippet.split("\n")]  # CRLF files: as read_file shows them
    return "\n".join([head] + [f"{first + i:>6}\t{line}" for i, line in enumerate(lines)])
