"""Showing an episode in a terminal as it happens (rich): each turn's text, its tool calls
with one-line result summaries, edits as coloured diffs, the final diff, and what applying it did.

Used as the `observer` of `run_episode` by `vivace agent`; it only prints.

Everything shown that comes from the repository, a tool or the model passes through `visible`
first: control characters other than newline and tab (C0, DEL, C1: ESC, BEL, CR, ...) are shown
as escapes like `\\x1b`, so a file or a reply cannot retitle, clear or otherwise drive the
developer's terminal. It does not touch other invisible characters (bidirectional overrides,
zero-width spaces), which a terminal displays rather than obeys.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from vivace.harness.executor import ToolOutcome
from vivace.harness.messages import AssistantTurn
from vivace.harness.trajectory import Trajectory

if TYPE_CHECKING:
    from vivace.sandbox.apply import ApplyReport

_EDIT_TOOLS = ("edit_file", "write_file")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all of C0 but \t and \n, DEL, all of C1


def visible(text: str) -> str:
    """`text` with control characters other than \\n and \\t written as escapes (`\\r`, `\\x1b`)."""
    return _CONTROL.sub(lambda m: "\\r" if m.group() == "\r" else f"\\x{ord(m.group()):02x}", text)


def visible_line(text: str) -> str:
    """`visible(text)` with \\n and \\t escaped too: a name (a path, a symbol) shown on one line of a
    listing, where a newline in a file's name would otherwise start a line that looks like another entry."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


class EpisodePrinter:
    """An observer for `run_episode` that prints to a rich console."""

    def __init__(self, console: Console):
        self.console = console
        self.turn = 0
        self._waiting: Any = None  # the spinner shown while the model is asked (a terminal only)

    def __call__(self, kind: str, payload: Any) -> None:
        if kind == "waiting":
            # An endpoint may think for minutes (or never answer): say what the wait is for.
            self._waiting = self.console.status(f"turn {payload}: waiting for the model...", spinner="dots")
            self._waiting.start()
            return
        self.stop_waiting()
        if kind == "assistant":
            self._assistant(payload)
        elif kind == "tool":
            self._tool(payload)
        elif kind == "end":
            self._end(payload)

    def stop_waiting(self) -> None:
        """Take the spinner down (an episode cancelled while the model was asked sends no event after)."""
        if self._waiting is not None:
            self._waiting.stop()
            self._waiting = None

    def _assistant(self, reply: AssistantTurn) -> None:
        self.turn += 1
        calls = len(reply.message.tool_calls)
        head = f"turn {self.turn}" + (f" · {calls} tool call{'s' * (calls != 1)}" if calls else "")
        self.console.rule(f"[bold]{head}[/bold]", align="left", style="dim")
        if reply.message.content:
            self.console.print(escape(visible(reply.message.content)))

    def _tool(self, o: ToolOutcome) -> None:
        args = o.call.arguments
        shown = ", ".join(f"{k}={_short(v)}" for k, v in args.items()) if isinstance(args, dict) else _short(args)
        colour = "red" if o.result.is_error else "cyan"
        self.console.print(
            f"[{colour}]→ {escape(visible(o.call.name or '?'))}[/{colour}]({escape(visible(shown))}) "
            f"[dim]{o.duration_s * 1e3:.0f} ms[/dim]"
        )
        if o.result.is_error or o.call.name not in _EDIT_TOOLS:
            first = o.result.text.strip().splitlines()[0] if o.result.text.strip() else ""
            lines = o.result.text.count("\n") + 1
            more = f" [dim](+{lines - 1} lines)[/dim]" if lines > 1 else ""
            self.console.print(f"  [dim]{escape(_clip(visible(first), 160))}[/dim]{more}")
        elif isinstance(args, dict):
            old = args.get("old_string", "") if o.call.name == "edit_file" else ""
            new = args.get("new_string", "") if o.call.name == "edit_file" else args.get("content", "")
            self.console.print(colour_diff(_mini_diff(str(old), str(new), str(args.get("path", "")))))

    def _end(self, traj: Trajectory) -> None:
        self.console.rule("[bold]result[/bold]", align="left", style="dim")  # the answer was shown in its turn
        if traj.diff:
            self.console.print(colour_diff(traj.diff, SHOWN_DIFF_LINES))
        elif traj.diff_failed:  # not "no changes": what the agent changed is unknown
            self.console.print("[red](the changes could not be computed: see below)[/red]")
        else:
            self.console.print("[dim](no changes)[/dim]")
        tail = f" — {escape(visible(traj.error))}" if traj.error else ""
        self.console.print(
            f"[dim]{len(traj.turns)} turns, {traj.tool_calls} tool calls, {traj.format_errors} format errors, "
            f"{traj.wall_s:.1f} s, stopped: {traj.stop_reason}{tail}[/dim]"
        )


def print_apply_report(console: Console, report: ApplyReport, repo: object, stopped: bool = False) -> None:
    """What applying the diff did to `repo`: each path left as it was and why, the paths merged
    with the developer's own edits and, when a Ctrl-C `stopped` it part-way, the paths it changed."""
    where, left = escape(visible_line(str(repo))), len(report.left)
    if stopped:
        console.print(f"[yellow]stopped while applying[/yellow]; changed in {where} before the stop:")
        for path in report.applied:
            console.print(f"  {escape(visible_line(path))}")
    elif left:
        total = len(report.applied) + left
        console.print(f"[yellow]applied {total - left} of {total} paths to {where}[/yellow]")
    else:
        console.print(f"[green]applied to {where}[/green]")
    if left:
        console.print("not applied (the diff above has them):")
    for path, why in report.left.items():
        console.print(f"  {escape(visible_line(path))}: {escape(visible(why))}")
    if report.merged:
        console.print("merged with the changes made there while the agent ran:")
        for path in report.merged:
            console.print(f"  {escape(visible_line(path))}")
    if stopped:
        console.print("[yellow]the rest of the diff above is not applied[/yellow]")


# How much of an episode's whole diff the terminal shows: `rm -rf` of a large directory, or one edit in a
# minified bundle, made a diff of megabytes, printed whole before the question whether to apply it.
SHOWN_DIFF_LINES = 2000
SHOWN_LINE_CHARS = 1000


def colour_diff(diff: str, max_lines: int | None = None) -> Text:
    """A unified diff coloured by line kind, with control characters made visible; with `max_lines`, at
    most that many lines of at most SHOWN_LINE_CHARS characters, then a note of what was left out."""
    text = Text()
    lines = diff.split("\n")  # \n only: a \r or form feed inside a line is shown, not taken as a line break
    lines = lines[:-1] if lines[-1] == "" else lines
    left = len(lines) - max_lines if max_lines is not None and len(lines) > max_lines else 0
    for line in lines[: len(lines) - left]:
        if max_lines is not None and len(line) > SHOWN_LINE_CHARS:
            line = f"{line[:SHOWN_LINE_CHARS]}… ({len(line) - SHOWN_LINE_CHARS:,} more characters)"
        style = ""
        if line.startswith(("+++", "---", "diff --git")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        text.append(visible(line) + "\n", style=style)
    if left:
        files = sum(line.startswith("diff --git ") for line in lines[len(lines) - left :])
        text.append(f"… {left:,} more lines of the diff not shown ({files} more files); --json prints it whole\n",
                    style="dim")  # fmt: skip
    return text


def _mini_diff(old: str, new: str, path: str) -> str:
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), path, path, n=1)
    return "".join(line if line.endswith("\n") else line + "\n" for line in list(lines)[2:])


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _clip(text.replace("\n", "⏎"), 60)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
