"""File tools: read_file, edit_file, write_file, delete_file and list_dir.

They go through the workspace's file API (never a shell), so paths are confined by the
workspace itself: `..`, absolute paths and symlinks leading outside come back as
PathEscapeError and are reported as an error result, as is every other expected failure
(missing file, directory, binary file). Edits are exact string replacements with one
forgiving fallback (whitespace-insensitive line matching) because models often get
indentation slightly wrong; anything fuzzier would risk editing the wrong place.

Not covered: encodings other than UTF-8 (read_file shows invalid bytes replaced; edits
refuse such files) and directory operations beyond listing (use run_terminal_cmd).
"""

from __future__ import annotations

import re
import warnings
from typing import ClassVar

from pydantic import Field

from vivace.harness.tools.base import Access, ToolArgs, ToolContext, ToolResult, WorkspacePath, norm_path, truncate
from vivace.harness.tools.indent import fit_lines
from vivace.harness.tools.suggest import closest_lines, path_hint, workspace_files
from vivace.sandbox.base import NotAFileError, PathEscapeError, SandboxError, SymlinkLoop, WorkspaceFileNotFound

MAX_LINE_CHARS = 2_000  # per displayed line; minified files would otherwise fill the budget with one line
BINARY_PROBE = 8_192
SNIPPET_CONTEXT = 2
SNIPPET_MAX_LINES = 20
MAX_ERROR_CHARS = 1_000


def error(text: str) -> ToolResult:
    # Capped: a hostile 100 KB path or a long stderr must not become a 100 KB error message.
    return ToolResult(truncate(f"Error: {text}", max_chars=MAX_ERROR_CHARS, max_lines=50), is_error=True)


def display_path(path: str) -> str:
    """`path` as messages name it: quoted when it is empty, has surrounding whitespace or
    unprintable characters, so the model sees what it actually sent."""
    return path if path and path == path.strip() and path.isprintable() else repr(path)


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def path_problem(path: str, *, file: bool = False) -> ToolResult | None:
    """The error for a path no file operation can mean: empty, or (`file`: one to write) a
    directory spelling ending in '/'."""
    if not path.strip():
        return error("path is empty; give a path relative to the workspace root.")
    if "\0" in path:  # not "outside the workspace", which the file API's refusal would say
        return error(
            f"{display_path(path)} contains a NUL byte, which no file name can hold; give the path without it."
        )
    if file and path.endswith("/"):
        return error(f"{display_path(path)} ends in '/', so it names a directory; give a file path.")
    if file and (path != path.strip() or _CONTROL.search(path)):  # a stray "\n" made a junk file --apply kept
        return error(
            f"{display_path(path)} has surrounding whitespace or a control character, which a file name to write "
            "should not; give the path without it."
        )
    return None


def fs_error(e: Exception, path: str, *, missing: str = "") -> ToolResult:
    """The error result for an expected file-API failure; `missing` overrides the not-found text."""
    if isinstance(e, SymlinkLoop):
        return error(f"{display_path(path)} is a symlink loop (too many levels of symbolic links): its links lead "
                     "back to themselves, so it names no file.")  # fmt: skip
    if isinstance(e, PathEscapeError):
        return error(f"path {path!r} is outside the workspace; use a path relative to the workspace root.")
    path = display_path(path)
    if isinstance(e, WorkspaceFileNotFound | FileNotFoundError):
        return error(missing or f"{path} does not exist.")
    if isinstance(e, NotAFileError) and "read limit" in str(e):  # the file API's refusal of a huge file
        return error(
            f"{path} is too large to read whole ({e}); find the lines you need with grep, then print them with "
            "run_terminal_cmd (e.g. sed -n '100,150p' FILE)."
        )
    if isinstance(e, NotAFileError | IsADirectoryError):
        return error(f"{path} is not a regular file ({e}).")
    if isinstance(e, UnicodeDecodeError):
        return error(f"{path} is not valid UTF-8 text ({e.reason} at byte {e.start}); it cannot be edited as text.")
    reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)  # str(e) repeats the path
    return error(f"could not access {path}: {reason}")


EXPECTED = (SandboxError, OSError, UnicodeDecodeError)


def not_text(path: str, data: bytes, action: str) -> ToolResult:
    """The refusal of a file the text tools cannot `action` ("shown", "edited"): UTF-16 or UTF-32 text
    (a byte-order mark; its NUL bytes make it look binary, and grep, which transcodes it, finds matches
    there) is named as such, with how to convert it; anything else is binary."""
    for bom, kind in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                      (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16")):  # fmt: skip
        if data.startswith(bom):
            return error(f"{path} is {kind} text ({len(data)} bytes) and cannot be {action} as text: the file tools "
                         f"read UTF-8 only; convert it with run_terminal_cmd (iconv -f {kind} -t UTF-8).")  # fmt: skip
    return error(f"{path} is a binary file ({len(data)} bytes) and cannot be {action} as text.")


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:BINARY_PROBE]


def count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def split_lines(text: str) -> list[str]:
    """Lines split on \\n only (as rg and editors number them), without the terminator."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def numbered(n: int, line: str) -> str:
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS] + f" [... line cut: {len(line) - MAX_LINE_CHARS} more characters]"
    return f"{n:>6}\t{line}"


# Files past this are not compiled for the syntax warning: compile() runs in the harness's process and
# holds the event loop, at ~170 MB and ~1 s per MB of source here (a 20 MB file the model generated
# took an episode's harness to 5.6 GB and 57 s past its wall-clock limit).
MAX_SYNTAX_CHECK_CHARS = 256 * 1024


def syntax_warning(path: str, before: str | None, after: str) -> str:
    """A warning when a .py file stopped compiling because of this change ('' otherwise, and for a file
    over MAX_SYNTAX_CHECK_CHARS)."""
    if not path.endswith((".py", ".pyi")) or len(after) > MAX_SYNTAX_CHECK_CHARS:
        return ""
    if before is not None and (len(before) > MAX_SYNTAX_CHECK_CHARS or _syntax_error(before) is not None):
        return ""  # it was already broken: not this edit's doing
    err = _syntax_error(after)
    if err is None:
        return ""
    return f"\nWarning: this edit introduced a syntax error at line {err.lineno}: {err.msg}"


def _syntax_error(text: str) -> SyntaxError | None:
    try:
        with warnings.catch_warnings():
            # compile() also warns about odd but valid code (`1[0]`): the file is the agent's, and the
            # warning would land in the user's terminal, not in the tool result.
            warnings.simplefilter("ignore", SyntaxWarning)
            # A UTF-8 BOM, which Python reads past in a file, is an invalid character in a str to compile.
            compile(text.removeprefix("\ufeff"), "<file>", "exec", dont_inherit=True)
    except SyntaxError as e:
        return e
    except (ValueError, RecursionError, MemoryError):  # NUL bytes, absurd nesting: not ours to judge
        return None
    return None


class _PathArgs(ToolArgs):
    path: WorkspacePath = Field(description="File path relative to the workspace root.")


# -- read_file --------------------------------------------------------------------------------------


class ReadFileArgs(_PathArgs):
    offset: int = Field(1, ge=1, description="1-based number of the first line to show.")
    limit: int | None = Field(None, ge=1, description="Maximum number of lines to show (default: to the end).")


class ReadFile:
    name: ClassVar[str] = "read_file"
    description: ClassVar[str] = (
        "Read a text file from the workspace. Returns its lines numbered as `     N<TAB>text`; lines over "
        f"{MAX_LINE_CHARS} characters are cut. Use offset (1-based) and limit to read part of a long file; "
        "long output is truncated in the middle with a note. Binary files and directories are refused."
    )
    Args: ClassVar[type[ToolArgs]] = ReadFileArgs

    def access(self, args: ReadFileArgs) -> Access:
        return Access(reads=frozenset({norm_path(args.path)}))

    async def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        ws, path = ctx.workspace, args.path
        if problem := path_problem(path):
            return problem
        try:
            data = await ws.read_bytes(path)
        except NotAFileError as e:
            if await _is_dir(ctx, path):
                return error(f"{path} is a directory; use list_dir to see what it contains.")
            return fs_error(e, path)
        except EXPECTED as e:
            return await file_error(ctx, e, path)
        if is_binary(data):
            return not_text(path, data, "shown")
        if not data:
            return ToolResult("(empty file)")
        try:
            decoded, note = data.decode("utf-8"), ""
        except UnicodeDecodeError as e:  # said, not only shown as U+FFFD: the model cannot tell them apart
            decoded = data.decode("utf-8", errors="replace")
            note = (f"[{path} is not UTF-8 text (from byte {e.start}): bytes shown as \ufffd are not that character; "
                    "edit_file cannot edit it, and writing it back with them would destroy them]")  # fmt: skip
        lines = split_lines(decoded)
        total = len(lines)
        if args.offset > total:
            return error(f"offset {args.offset} is past the end of {path}, which has {total} lines.")
        end = total if args.limit is None else min(total, args.offset - 1 + args.limit)
        out = [numbered(n, lines[n - 1]) for n in range(args.offset, end + 1)]
        if args.offset > 1 or end < total:
            out.append(f"[showing lines {args.offset}-{end} of {total}; use offset and limit to see more]")
        if note:
            out.append(note)
        text = truncate("\n".join(out) + "\n", ctx.max_result_chars, hint="use offset and limit to read a range")
        return ToolResult(text.rstrip("\n"))


FIND_IT = "use list_dir or glob_file_search to find it"


def missing_file(path: str, files: list[str], then: str = FIND_IT) -> ToolResult:
    """The error for a file that does not exist: the existing `files` it most likely meant, else `then`."""
    hint = path_hint(path, files)
    name = display_path(path)
    return error(f"{name} does not exist.{hint}" if hint else f"{name} does not exist; {then}.")


async def file_error(ctx: ToolContext, e: Exception, path: str, then: str = FIND_IT) -> ToolResult:
    """fs_error, where a missing file's text names the existing files it most likely meant."""
    if not isinstance(e, WorkspaceFileNotFound | FileNotFoundError):
        return fs_error(e, path)
    return missing_file(path, await workspace_files(ctx.workspace), then)


async def _is_dir(ctx: ToolContext, path: str) -> bool:
    try:
        return (await ctx.workspace.stat(path)).kind == "dir"
    except EXPECTED:
        return False


# -- edit_file --------------------------------------------------------------------------------------


class EditFileArgs(_PathArgs):
    old_string: str = Field(
        description="Exact text to replace, including indentation; it must occur once unless replace_all. "
        "Empty: create the file (it must not exist or be empty) with new_string."
    )
    new_string: str = Field(description="Text that replaces old_string.")
    replace_all: bool = Field(False, description="Replace every occurrence instead of requiring exactly one.")


class EditFile:
    name: ClassVar[str] = "edit_file"
    description: ClassVar[str] = (
        "Edit a text file by exact string replacement: old_string must appear exactly once (include enough "
        "surrounding lines to make it unique) unless replace_all is set. If there is no exact match, a match "
        "ignoring leading/trailing whitespace on each line is tried. An empty old_string creates a new file. "
        "Returns the number of replacements and the changed lines with line numbers, plus a warning when a "
        "Python file no longer parses."
    )
    Args: ClassVar[type[ToolArgs]] = EditFileArgs

    def access(self, args: EditFileArgs) -> Access:
        return Access(writes=frozenset({norm_path(args.path)}))

    async def run(self, args: EditFileArgs, ctx: ToolContext) -> ToolResult:
        path, old, new = args.path, args.old_string, args.new_string
        if problem := path_problem(path, file=True):
            return problem
        if old == new:
            return error("old_string and new_string are the same; nothing to change.")
        try:
            data: bytes | None = await ctx.workspace.read_bytes(path)
        except WorkspaceFileNotFound:
            data = None
        except EXPECTED as e:
            return fs_error(e, path)
        if data is not None and is_binary(data):
            return not_text(path, data, "edited")
        try:
            before = None if data is None else data.decode("utf-8")
        except UnicodeDecodeError as e:
            return fs_error(e, path)
        if old == "":
            return await self._create(ctx, path, before, new)
        if before is None:
            hint = path_hint(path, await workspace_files(ctx.workspace))
            return error(
                f"{display_path(path)} does not exist.{hint} To create it, use write_file or edit_file with an empty "
                "old_string."
            )
        edit = replace_text(before, old, new, args.replace_all, path)
        if isinstance(edit, ToolResult):
            return edit
        after, spans, fuzzy = edit
        if after == before:  # a CRLF file: new_string took its line endings back, as old_string did
            return error(f"this edit changes nothing: old_string and new_string differ only in line endings, and "
                         f"edit_file keeps {path}'s (CRLF); to change them, use run_terminal_cmd "
                         f"(e.g. sed -i 's/\\r$//' {path})")  # fmt: skip
        try:
            await ctx.workspace.write_bytes(path, after.encode("utf-8"))
        except EXPECTED as e:
            return fs_error(e, path)
        note = " (matched ignoring whitespace differences)" if fuzzy else ""
        text = f"Edited {path}: replaced {len(spans)} occurrence(s){note}\n{_snippet(after, spans)}"
        return ToolResult(text + syntax_warning(path, before, after), meta={"replacements": len(spans)})

    async def _create(self, ctx: ToolContext, path: str, before: str | None, new: str) -> ToolResult:
        if before:
            return error(f"{path} already exists; give old_string to edit it or use write_file to replace it.")
        try:
            await ctx.workspace.write_bytes(path, new.encode("utf-8"))
        except EXPECTED as e:
            return fs_error(e, path)
        how = "Created" if before is None else "Wrote the previously empty file"
        return ToolResult(f"{how} {path} ({count_lines(new)} lines)" + syntax_warning(path, None, new))


BOM = "\ufeff"
Span = tuple[int, int]  # character offsets [start, end) of replaced text in the new file
_BARE_LF = re.compile(r"(?<!\r)\n")


def replace_text(
    text: str, old: str, new: str, replace_all: bool, path: str
) -> tuple[str, list[Span], bool] | ToolResult:
    """The edited text, where the replacements landed, and whether the whitespace fallback matched."""
    if text.startswith(BOM):  # an editor's byte-order mark is no part of line 1: the fallback missed that line
        edit = replace_text(text[1:], old.removeprefix(BOM), new.removeprefix(BOM), replace_all, path)
        if isinstance(edit, ToolResult):
            return edit
        after, spans, fuzzy = edit
        return BOM + after, [(start + 1, end + 1) for start, end in spans], fuzzy
    if "\r\n" in text:  # a CRLF file edited with \n text: keep its line endings
        crlf_old = _BARE_LF.sub("\r\n", old)
        if "\n" in old:  # (not when old_string matches \n lines of a mixed file)
            crlf = crlf_old in text or old not in text
        else:  # within one line: the ending of the line it is on (a mixed file has both)
            crlf = _ends_crlf(text, text.find(old))
        if crlf:
            old, new = crlf_old, _BARE_LF.sub("\r\n", new)
    starts = _find_all(text, old)
    if not starts:
        return _fuzzy_replace(text, old, new, path)
    if len(starts) > 1 and not replace_all:
        return error(
            f"old_string occurs {len(starts)} times in {path} ({_line_list(text, starts)}); include more "
            "surrounding lines to make it unique, or set replace_all."
        )
    parts, spans, prev, shift = [], [], 0, 0
    for s in starts:
        parts += [text[prev:s], new]
        spans.append((s + shift, s + shift + len(new)))
        shift += len(new) - len(old)
        prev = s + len(old)
    parts.append(text[prev:])
    return "".join(parts), spans, False


def _ends_crlf(text: str, at: int) -> bool:
    """Whether the line holding offset `at` ends in \r\n (the last line, without an ending: whether the one
    before it does); True for -1 (not found), as for a whole CRLF file."""
    if at < 0:
        return True
    end = text.find("\n", at)
    end = end if end >= 0 else text.rfind("\n", 0, at)
    return end > 0 and text[end - 1] == "\r"


def _line_list(text: str, starts: list[int], most: int = 10) -> str:
    """'lines 1, 5' for the distinct lines where `starts` fall ('line 1' when all on one)."""
    lines: list[int] = []
    n, prev = 1, 0
    for s in starts:  # ascending: count newlines from the previous start only
        n, prev = n + text.count("\n", prev, s), s
        if not lines or lines[-1] != n:
            if len(lines) == most:
                return "lines " + ", ".join(map(str, lines)) + ", …"
            lines.append(n)
    return ("line " if len(lines) == 1 else "lines ") + ", ".join(map(str, lines))


def _find_all(text: str, needle: str) -> list[int]:
    out, i = [], text.find(needle)
    while i >= 0:
        out.append(i)
        i = text.find(needle, i + len(needle))
    return out


FUZZY_MATCH_BUDGET = 2_000_000  # line comparisons the whitespace-blind match may make


def _fuzzy_replace(text: str, old: str, new: str, path: str) -> tuple[str, list[Span], bool] | ToolResult:
    """Match old_string line by line with each line's surrounding whitespace stripped; replace
    the whole matched lines with new_string, its indentation carried over to the file's."""
    advice = "read the file and copy the text exactly, including indentation"

    def not_found() -> ToolResult:
        return error(f"old_string was not found in {path}; {advice}.{closest_text(text, old, path)}")

    want = old.split("\n")
    while want and not want[0].strip():
        want.pop(0)
    while want and not want[-1].strip():
        want.pop()
    if not want:
        return not_found()
    lines = text.split("\n")
    key = [w.strip() for w in want]
    stripped = [line.strip() for line in lines]
    starts = [i for i in range(len(lines) - len(key) + 1) if stripped[i] == key[0]]
    # Each start compares up to len(key) lines: a long old_string whose first line recurs (blank-ish
    # lines, a repeated statement) made this quadratic, on the event loop (5,000 lines in 100,000: 50 s).
    if len(starts) * len(key) > FUZZY_MATCH_BUDGET:
        return error(f"old_string was not found in {path} as written, and it is too long to look for ignoring "
                     f"whitespace ({len(key)} lines, whose first occurs {len(starts)} times); {advice}, or edit "
                     "a shorter, unique part")  # fmt: skip
    hits = [i for i in starts if stripped[i : i + len(key)] == key]
    if len(hits) != 1:
        if not hits:
            return not_found()
        return error(
            f"old_string was not found in {path} (ignoring whitespace it matches {len(hits)} places); {advice}."
        )
    i = hits[0]
    matched = lines[i : i + len(key)]
    eol = "\r" if matched[-1].endswith("\r") else ""
    new_lines = [] if not new else (new[:-1] if new.endswith("\n") else new).split("\n")
    body = fit_lines(want, matched, [line.rstrip("\r") for line in new_lines], lines, eol)
    if isinstance(body, str):
        shown = "\n".join(numbered(i + 1 + k, line.rstrip("\r")) for k, line in enumerate(matched))
        return error(
            f"old_string matches {path} at line {i + 1} only ignoring whitespace, and its indentation does not "
            f"map onto the file's: {body}. Nothing was changed; {advice} (the matched lines are below).\n{shown}"
        )
    start = sum(len(line) + 1 for line in lines[:i])
    replaced = "\n".join(body)
    out = lines[:i] + body + lines[i + len(key) :]
    return "\n".join(out), [(start, start + len(replaced))], True


def closest_text(text: str, old: str, path: str) -> str:
    """'\nThe closest text in PATH is at line N:' and those lines numbered as read_file shows them
    (the retry copies from there); '' when no line is close."""
    found = closest_lines(text, old)
    if found is None:
        return ""
    first, lines = found
    shown = "\n".join(numbered(first + k, line) for k, line in enumerate(lines))
    return f"\nThe closest text in {path} is at line {first}:\n{shown}"


def _snippet(text: str, spans: list[Span]) -> str:
    """The changed region with line numbers and a little context, at most SNIPPET_MAX_LINES lines."""
    lines = split_lines(text)
    first = text.count("\n", 0, spans[0][0])
    last_end = max(spans[-1][1] - 1, spans[-1][0])
    last = text.count("\n", 0, last_end) if spans[-1][1] > spans[-1][0] else first
    lo, hi = max(0, first - SNIPPET_CONTEXT), min(len(lines), last + SNIPPET_CONTEXT + 1)
    shown = [numbered(n + 1, lines[n]) for n in range(lo, min(hi, lo + SNIPPET_MAX_LINES))]
    if hi > lo + SNIPPET_MAX_LINES:
        shown.append(f"[... {hi - lo - SNIPPET_MAX_LINES} more changed lines not shown; use read_file to see them]")
    return "\n".join(shown) if shown else "(the file is now empty)"


# -- write_file -------------------------------------------------------------------------------------


class WriteFileArgs(_PathArgs):
    content: str = Field(description="The complete new content of the file.")


class WriteFile:
    name: ClassVar[str] = "write_file"
    description: ClassVar[str] = (
        "Create a file or replace its whole content (missing parent directories are created). Returns "
        "whether the file was created or overwritten and its line count, plus a warning when a Python file "
        "does not parse. Prefer edit_file for changing part of an existing file."
    )
    Args: ClassVar[type[ToolArgs]] = WriteFileArgs

    def access(self, args: WriteFileArgs) -> Access:
        return Access(writes=frozenset({norm_path(args.path)}))

    async def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
        path = args.path
        if problem := path_problem(path, file=True):
            return problem
        try:
            old: bytes | None = await ctx.workspace.read_bytes(path)
        except WorkspaceFileNotFound:
            old = None
        except NotAFileError as e:
            if await _is_dir(ctx, path):
                return error(f"{path} is a directory; give a file path.")
            return fs_error(e, path)
        except EXPECTED as e:
            return fs_error(e, path)
        content, kept = args.content, ""
        if old is not None and not is_binary(old):
            try:
                old.decode("utf-8")
            except UnicodeDecodeError as e:
                if "\ufffd" in content:  # read_file's stand-in for the bytes it could not decode
                    return error(
                        f"{path} is not UTF-8 text (byte {e.start} is not), and this content holds U+FFFD where "
                        "read_file showed its undecodable bytes: writing it would replace them for good. Convert "
                        f"the file to UTF-8 first (run_terminal_cmd: iconv -f latin1 -t utf-8 {path} > {path}.tmp "
                        f"&& mv {path}.tmp {path}), or write content without U+FFFD."
                    )
            if old.count(b"\r\n") == old.count(b"\n") > 0 and "\n" in content and "\r\n" not in content:
                # read_file shows lines without their \r: content written from it kept CRLF files LF
                content, kept = content.replace("\n", "\r\n"), "; kept its CRLF line endings"
        try:
            await ctx.workspace.write_bytes(path, content.encode("utf-8"))
        except EXPECTED as e:
            return fs_error(e, path)
        how = "new file" if old is None else "overwrote the previous content"
        before = None if old is None else old.decode("utf-8", errors="replace")
        text = f"Wrote {path} ({count_lines(content)} lines, {how}{kept})"
        return ToolResult(text + syntax_warning(path, before, content), meta={"created": old is None})


# -- delete_file ------------------------------------------------------------------------------------


class DeleteFile:
    name: ClassVar[str] = "delete_file"
    description: ClassVar[str] = (
        "Delete one file or symbolic link (a symlink itself is removed, never its target). Directories are "
        "refused; use run_terminal_cmd to remove a directory."
    )
    Args: ClassVar[type[ToolArgs]] = _PathArgs

    def access(self, args: _PathArgs) -> Access:
        return Access(writes=frozenset({norm_path(args.path)}))

    async def run(self, args: _PathArgs, ctx: ToolContext) -> ToolResult:
        path = args.path
        if problem := path_problem(path):
            return problem
        try:
            st = await ctx.workspace.stat(path)
            if st.kind == "dir":
                return error(f"{path} is a directory; delete_file removes files only (use run_terminal_cmd rm -r).")
            await ctx.workspace.remove(path)
        except EXPECTED as e:
            return await file_error(ctx, e, path, then="nothing was deleted")
        return ToolResult(f"Deleted {'symlink ' if st.kind == 'symlink' else ''}{path}")


# -- list_dir ---------------------------------------------------------------------------------------


class ListDirArgs(ToolArgs):
    path: WorkspacePath = Field(".", description="Directory path relative to the workspace root (default: the root).")


class ListDir:
    name: ClassVar[str] = "list_dir"
    description: ClassVar[str] = (
        "List one directory (not recursive): subdirectories first with a trailing `/`, then files with their "
        "sizes; symlinks end in `@`. `.git` is hidden. Use glob_file_search to find files at any depth."
    )
    Args: ClassVar[type[ToolArgs]] = ListDirArgs

    def access(self, args: ListDirArgs) -> Access:
        return Access(reads=frozenset({norm_path(args.path)}))

    async def run(self, args: ListDirArgs, ctx: ToolContext) -> ToolResult:
        path = args.path
        try:
            entries = await ctx.workspace.list(path)
        except NotAFileError:
            return error(f"{path} is not a directory; use read_file to read a file.")
        except EXPECTED as e:
            return fs_error(e, path, missing=f"directory {path} does not exist.")
        entries = [e for e in entries if e.name != ".git"]
        if not entries:
            return ToolResult("(empty directory)")
        dirs = [f"{e.name}/" for e in entries if e.kind == "dir"]
        rest = [_entry_line(e.name, e.kind, e.size) for e in entries if e.kind != "dir"]
        text = "\n".join(dirs + rest) + "\n"
        text = truncate(text, ctx.max_result_chars, hint="list a subdirectory or use glob_file_search")
        return ToolResult(text.rstrip("\n"))


def _entry_line(name: str, kind: str, size: int) -> str:
    if kind == "symlink":
        return f"{name}@"
    if kind != "file":
        return f"{name} ({kind})"
    return f"{name} ({human_size(size)})"


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
