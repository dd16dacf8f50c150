"""Scripted baselines that act through the real tools: the ceiling and the floor of a report.

- `scripted:oracle`: an efficient expert that knows the reference patch. Turn 1 reads every
  file the patch touches at once; turn 2 applies the patch hunk by hunk with edit_file
  (write_file / delete_file for whole files); turn 3 runs the tests and lints together;
  then it answers with what it changed and what the test run showed — nothing more.
- `scripted:random`: looks at one random Python file and makes one random operator edit.
- `scripted:random-edit`: a non-learned bug fixer — finds the function the failing test names
  (the longest function name the test's name starts with or contains), reads its file and
  applies one random single-line mutation inside it (the generator's own operators, which
  include the reverse of most injected bugs). The bar a learned policy has to clear.

Both need the task (`for_task`), so they run under `vivace bench` and RL, not `vivace agent`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from vivace.bench.patch import FileChange, Hunk, is_test_path, parse_patch
from vivace.harness.messages import AssistantTurn, Message, ToolCall
from vivace.harness.policy import Conversation, PolicyError
from vivace.tasks.format import Task
from vivace.tasks.mutate import mutations


def _turn(content: str, *calls: tuple[str, dict]) -> AssistantTurn:
    return AssistantTurn(
        Message("assistant", content, tuple(ToolCall(f"call_{i}", n, a) for i, (n, a) in enumerate(calls)))
    )


def _turn_index(conversation: Conversation) -> int:
    return sum(m.role == "assistant" for m in conversation.messages)


class _NeedsTask:
    name = "scripted"

    async def act(self, conversation: Conversation) -> AssistantTurn:
        raise PolicyError(f"{self.name} needs its task: use it with `vivace bench` or RL, not on a bare repository")


class OraclePolicy(_NeedsTask):
    name = "scripted:oracle"

    def __init__(self, style: str = "efficient", minimal: bool = False):
        self.style, self.minimal = style, minimal

    def for_task(self, task: Task) -> _Oracle:
        return _Oracle(task, self.style, self.minimal)


STYLES = ("efficient", "serial", "redundant", "no-tests")


class _Oracle:
    """The expert. `style` gives the correct-but-inefficient variants used as training data:
    serial (one call per turn), redundant (a needless listing and re-reads), no-tests (answers
    without checking). `minimal` cuts each edit's old_string to the changed lines plus the least
    context that makes it unique in the file (as read), instead of the whole diff hunk."""

    name = "scripted:oracle"

    def __init__(self, task: Task, style: str = "efficient", minimal: bool = False):
        if style not in STYLES:
            raise ValueError(f"unknown oracle style {style!r}; choose from {', '.join(STYLES)}")
        self.task, self.style, self.minimal = task, style, minimal
        self.changes = [c for c in parse_patch(task.reference_patch) if not is_test_path(c.path)]
        self.plan: list | None = None

    async def act(self, conversation: Conversation) -> AssistantTurn:
        if self.plan is None:
            self.plan = self._plan()
        step = _turn_index(conversation)
        if step >= len(self.plan):
            return AssistantTurn(Message("assistant", self._answer(conversation)))
        content, calls = self.plan[step]
        return _turn(content, *(calls(conversation) if callable(calls) else calls))

    def _plan(self) -> list:
        """(content, calls) per turn; calls may be a function of the conversation (edits need the files read)."""
        existing = [c.path for c in self.changes if not c.new_file]
        # Files whose facts the fix needs without changing them (multi-file task families).
        existing += [p for p in self.task.metadata.get("context_files", []) if p not in existing]
        reads = [("read_file", {"path": p}) for p in existing]
        py = [c.path for c in self.changes if c.path.endswith(".py") and not c.deleted]
        test = ("run_terminal_cmd", {"command": self.task.tests.command})
        lint = [("read_lints", {"paths": py})] if py else []
        n_edits = sum(len(_edits(c, minimal=self.minimal)) for c in self.changes)
        # An expert does not open a file nothing has pointed it to: when the request names none of
        # the changed files, it runs the tests first and reads what their traceback shows.
        changed = [c.path for c in self.changes if not c.new_file]
        discover = [("Running the tests to see what fails.", [test])] if changed and not any(
            p in self.task.request for p in changed) else []  # fmt: skip
        if self.style == "serial":
            return (discover + [("Reading the code involved.", [r]) for r in reads]
                    + [("", lambda conv, i=i: [self._edit_calls(conv)[i]]) for i in range(n_edits)]
                    + [("Checking the change.", [test])] + [("", [call]) for call in lint])  # fmt: skip
        plan = discover + ([("Reading the code involved.", reads)] if reads else [])
        if self.style == "redundant":
            plan = [("Looking around first.", [("list_dir", {"path": "."})]), *plan]
        plan.append(("", self._edit_calls))
        if self.style == "redundant" and reads:
            plan.append(("Reading the files again.", reads))
        if self.style != "no-tests":
            plan.append(("Checking the change.", [test, *lint]))
        return plan

    def _edit_calls(self, conversation: Conversation) -> list[tuple[str, dict]]:
        files = files_read(conversation.messages)
        return [call for c in self.changes for call in _edits(c, files.get(c.path), self.minimal)]

    def _answer(self, conversation: Conversation) -> str:
        files = ", ".join(c.path for c in self.changes) or "nothing"
        if self.style == "no-tests":  # its only run (if any) was before the change: nothing to report
            return f"Changed {files}."
        runs = [m.content for m in conversation.messages if m.role == "tool" and m.content.startswith("Exit code:")]
        if runs and runs[-1].startswith("Exit code: 0"):
            summary = next((ln for ln in reversed(runs[-1].splitlines()) if " passed" in ln), "").strip(" =")
            return f"Changed {files}. The tests pass ({summary})." if summary else f"Changed {files}."
        if not runs:
            return f"Changed {files}."
        return f"Changed {files}. The test run did not succeed; see its output above."


def _edits(change: FileChange, content: str | None = None, minimal: bool = False) -> list[tuple[str, dict]]:
    """The tool calls that make one file's change. With the file's `content` (as read), a hunk whose text
    the file holds more than once is widened with the file's lines around it until unique, and with
    `minimal` each edit is cut to the least that is unique (see _minimal)."""
    if change.deleted:
        return [("delete_file", {"path": change.path})]
    if change.new_file:
        return [("write_file", {"path": change.path, "content": "".join(h.new for h in change.hunks)})]
    pairs, shift = [], 0
    for hunk in change.hunks:  # each is placed and cut against the file as the edits before it left it
        placed = (hunk.old, hunk.new) if content is None else _placed(hunk, content, shift)
        shift += hunk.new.count("\n") - hunk.old.count("\n")
        for pair in _per_line(*placed) if minimal else [placed]:  # as many edits with the content as without
            pairs.append(_minimal(*pair, content) if minimal and content is not None else pair)
            if content is not None:
                content = content.replace(pairs[-1][0], pairs[-1][1], 1)
    return [("edit_file", {"path": change.path, "old_string": old, "new_string": new}) for old, new in pairs]


def _placed(hunk: Hunk, content: str, shift: int) -> tuple[str, str]:
    """The hunk's (old, new), widened with the lines around where its @@ line puts it (`shift` lines
    further down after the earlier hunks' edits) until its old side occurs once in `content`: git apply
    goes by line number, so a reference patch may change one of two identical blocks."""
    if content.count(hunk.old) == 1:
        return hunk.old, hunk.new
    lines = [line + "\n" for line in content.split("\n")]
    lines[-1] = lines[-1][:-1]
    begin = hunk.line - 1 + shift if hunk.old else hunk.line + shift  # an empty old side: after that line
    end = begin + hunk.old.count("\n") + (not hunk.old.endswith("\n") and hunk.old != "")
    if "".join(lines[begin:end]) != hunk.old:
        return hunk.old, hunk.new  # not where it says (the file as read differs): edit_file will say so
    lo, hi = _widened(lines, begin, end, content)
    before, after = "".join(lines[lo:begin]), "".join(lines[end:hi])
    return before + hunk.old + after, before + hunk.new + after


def _per_line(old: str, new: str) -> list[tuple[str, str]]:
    """A hunk that substitutes several lines one for one, as one hunk per changed line (the other
    lines as they were before it, then as they are after it), applied in order; any other hunk as it is.

    Why: one old_string spanning two changed lines holds a newline, the indentation and every quote
    between them, all escaped inside a JSON string (measured: the tiny policy wrote none of the
    unused_loop_variable family's two-line old_strings right, teacher-forced); two short fragments
    ask for much less exact copying."""
    o, n = old.splitlines(keepends=True), new.splitlines(keepends=True)
    changed = [i for i in range(len(o)) if o[i] != n[i]] if len(o) == len(n) else []
    if len(changed) < 2:
        return [(old, new)]
    return [("".join(n[:i] + o[i:]), "".join(n[: i + 1] + o[i + 1 :])) for i in changed]


def _minimal(old: str, new: str, content: str) -> tuple[str, str]:
    """The hunk cut to its changed lines, widened with its own context until unique in `content`,
    then cut inside those lines to the changed words the same way (` bounnd` -> ` bound` rather than
    the whole line: less to copy exactly; a word keeps the space before it)."""
    o, n = old.splitlines(keepends=True), new.splitlines(keepends=True)
    found = _unique(o, n, *_changed(o, n), content)
    if not found:
        return old, new
    words_old, words_new = _WORD.findall(found[0]), _WORD.findall(found[1])
    cut = _unique(words_old, words_new, *_changed(words_old, words_new), content)
    if not cut or not cut[0].strip():
        return found
    at = found[0].find(cut[0])
    if at > 0 and found[0][at - 1] == " " and cut[0][0] != " ":  # (the new side has the same prefix)
        # Keep the word's leading space: a BPE tokenizer marks a word start with it, so ` bacth`
        # is the same tokens in the call as in the file the model copies it from (`bacth` is not).
        return " " + cut[0], " " + cut[1]
    return cut


_WORD = re.compile(r"\w+|\s+|[^\w\s]")


def _changed(old: list[str], new: list[str]) -> tuple[int, int]:
    """[lo, hi) of the pieces of `old` that differ from `new` (the same pieces before and after);
    a pure insertion is anchored on a neighbouring piece."""
    a = 0
    while a < min(len(old), len(new)) and old[a] == new[a]:
        a += 1
    b = 0
    while b < min(len(old), len(new)) - a and old[-1 - b] == new[-1 - b]:
        b += 1
    lo, hi = a, len(old) - b
    if lo == hi:
        lo, hi = (lo - 1, hi) if lo > 0 else (lo, hi + 1)
    return lo, hi


def _unique(old: list[str], new: list[str], lo: int, hi: int, content: str) -> tuple[str, str] | None:
    """An edit_file (old_string, new_string) pair from pieces (lines or words): `old[lo:hi]` is the
    changed region (`new` has the same pieces before `lo` and after `hi`), widened alternately
    before and after until the old side occurs exactly once in `content`; None when even all of
    `old` is not unique."""
    lo, hi = _widened(old, lo, hi, content)
    if content.count("".join(old[lo:hi])) != 1:
        return None
    return "".join(old[lo:hi]), "".join(new[lo : len(new) - (len(old) - hi)])


def _widened(pieces: list[str], lo: int, hi: int, content: str) -> tuple[int, int]:
    """[lo, hi) grown by a piece before, then one after, and so on, until the pieces it spans occur once
    in `content` or it spans them all."""
    up = True
    while content.count("".join(pieces[lo:hi])) != 1 and (lo > 0 or hi < len(pieces)):
        if (up and lo > 0) or hi == len(pieces):
            lo -= 1
        else:
            hi += 1
        up = not up
    return lo, hi


def files_read(messages: Sequence[Message]) -> dict[str, str]:
    """path -> content of every file read_file showed whole in the messages (line numbers removed)."""
    files, paths = {}, {}
    for m in messages:  # call ids repeat across turns: pair results with the last turn's calls
        if m.role == "assistant":
            paths = {c.id: c.arguments.get("path") for c in m.tool_calls
                     if c.name == "read_file" and isinstance(c.arguments, dict) and "offset" not in c.arguments}  # fmt: skip
        path = paths.get(m.tool_call_id) if m.role == "tool" else None
        if path and not m.content.startswith("Error"):
            files[path] = _file_text(m.content)
    return files


def _file_text(read_output: str) -> str:
    """A file's text from read_file's numbered lines (notes such as truncation markers dropped)."""
    lines = [re.match(r"^\s*\d+\t(.*)$", ln) for ln in read_output.split("\n")]
    return "\n".join(x.group(1) for x in lines if x) + "\n"


class RandomPolicy(_NeedsTask):
    name = "scripted:random"

    def for_task(self, task: Task) -> _Random:
        return _Random(task)


class _Random:
    name = "scripted:random"
    _OPS = (("+", "-"), ("-", "+"), ("<", "<="), (">", ">="), ("==", "!="), (" and ", " or "))

    def __init__(self, task: Task):
        self.rng = random.Random(task.id)

    async def act(self, conversation: Conversation) -> AssistantTurn:
        step = _turn_index(conversation)
        results = [m.content for m in conversation.messages if m.role == "tool"]
        if step == 0:
            return _turn("", ("glob_file_search", {"glob_pattern": "*.py"}))
        if step == 1:
            files = [p for p in results[-1].splitlines() if p.endswith(".py") and not is_test_path(p)]
            if files:
                return _turn("", ("read_file", {"path": self.rng.choice(files)}))
        if step == 2 and results:
            call = conversation.messages[-2].tool_calls[0] if conversation.messages[-2].tool_calls else None
            lines = [re.sub(r"^\s*\d+\t", "", ln) for ln in results[-1].splitlines()]
            options = [(ln, a, b) for ln in lines for a, b in self._OPS if a in ln]
            if call is not None and options:
                line, a, b = self.rng.choice(options)
                edit = {"path": call.arguments.get("path"), "old_string": line, "new_string": line.replace(a, b, 1)}
                return _turn("", ("edit_file", edit))
        return AssistantTurn(Message("assistant", "Done."))


class RandomEditPolicy(_NeedsTask):
    name = "scripted:random-edit"

    def for_task(self, task: Task) -> _RandomEdit:
        return _RandomEdit(task)


class _RandomEdit:
    name = "scripted:random-edit"

    def __init__(self, task: Task):
        self.rng = random.Random(task.id)
        self.tests = [t.split("::")[-1].split("[")[0].removeprefix("test_") for t in task.tests.fail_to_pass]
        self.target: tuple[str, str] | None = None  # (file, function)

    async def act(self, conversation: Conversation) -> AssistantTurn:
        step = _turn_index(conversation)
        results = [m.content for m in conversation.messages if m.role == "tool"]
        if step == 0:
            return _turn(
                "Finding the function the failing test names.", ("grep", {"pattern": r"^\s*def \w+", "glob": "*.py"})
            )
        if step == 1:
            self.target = self._named_function(results[-1])
            if self.target:
                return _turn("", ("read_file", {"path": self.target[0]}))
        if step == 2 and self.target:
            edit = self._random_mutation(results[-1])
            if edit:
                return _turn("", ("edit_file", edit))
        return AssistantTurn(Message("assistant", "Done."))

    def _named_function(self, grep_output: str) -> tuple[str, str] | None:
        found: list[tuple[str, str]] = []
        for line in grep_output.splitlines():
            m = re.match(r"^(.+?\.py):\d+:\s*(?:async\s+)?def (\w+)", line)
            if m and not is_test_path(m.group(1)):
                found.append((m.group(1), m.group(2)))
        named = [(len(f), p, f) for p, f in found for t in self.tests if not f.startswith("_") and f in t]
        if not named:
            return None
        longest = max(n for n, _, _ in named)
        path, func = self.rng.choice(sorted((p, f) for n, p, f in named if n == longest))
        return path, func

    def _random_mutation(self, read_output: str) -> dict | None:
        source = _file_text(read_output)
        path, func = self.target  # type: ignore[misc]
        try:
            options = [m for m in mutations(path, source) if m.function.split(".")[-1] == func]
        except SyntaxError:
            return None
        if not options:
            return None
        m = self.rng.choice(options)
        lines = source.splitlines(keepends=True)
        i = m.line - 1
        ending = lines[i][len(m.before) :]  # the line's newline (none on a last line without one)
        mutated = [*lines[:i], *([m.after + ending] if m.after != "" else []), *lines[i + 1 :]]
        pair = _unique(lines, mutated, i, i + 1, source)
        return {"path": path, "old_string": pair[0], "new_string": pair[1]} if pair else None
