"""Error lines say what they were given: `error: MESSAGE` with the message exactly as written. rich read
square brackets in a message as markup, so a path like dir[abc], a glob or a repr lost its bracketed part
(`[bold]` turned the rest bold, a stray `[/x]` raised MarkupError and a traceback), and the user read a
path that is not theirs."""

from __future__ import annotations

import io

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from vivace.cli import app, fail

VERBATIM = "cannot read /data/run[3]/src/[abc].py: [/x] [red] ['a', 'b'] [bold]still plain :100: C:\\dir\\"


def test_fail_prints_the_message_verbatim_and_exits_with_the_code(capsys):
    with pytest.raises(typer.Exit) as stopped:
        fail(VERBATIM, 3)
    assert stopped.value.exit_code == 3
    captured = capsys.readouterr()
    assert captured.err == f"error: {VERBATIM}\n" and captured.out == ""
    with pytest.raises(typer.Exit) as stopped:
        fail("plain")
    assert stopped.value.exit_code == 2


def test_fail_colours_the_label_only(monkeypatch):
    """On a terminal "error:" is red; no part of the message is styled (rich's highlighter coloured
    numbers and paths in it, each differently)."""
    screen = io.StringIO()
    monkeypatch.setattr("vivace.cli.err", Console(file=screen, force_terminal=True, color_system="standard"))
    with pytest.raises(typer.Exit):
        fail("step 12 of runs/x[1]/ckpt at 0x7f: 3.5 s")
    label, message = screen.getvalue().split(" ", 1)
    assert "\x1b[31m" in label and "error:" in label
    assert message == "step 12 of runs/x[1]/ckpt at 0x7f: 3.5 s\n"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """The working directory is tmp_path, with `full[abc]/` (a directory holding a file)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full[abc]").mkdir()
    (tmp_path / "full[abc]" / "x").touch()
    return tmp_path


# (command, the text the error line must show as given); none of them loads a model or starts work.
CASES = [
    (["agent", "x", "--repo", "/nonexistent/dir[abc]", "--model", "scripted:null"], "--repo /nonexistent/dir[abc] is"),
    (["sandbox", "run", "--repo", "/nonexistent/r[/x]", "--", "true"], "--repo /nonexistent/r[/x] does not exist"),
    (["sandbox", "run", "--repo", "/nonexistent/r[bold]b", "--", "true"], "--repo /nonexistent/r[bold]b does not"),
    (["serve", "--model", "/nonexistent/ckpt[abc]", "--port", "0", "--device", "cpu"], "'/nonexistent/ckpt[abc]'"),
    (["bench", "--model", "scripted:null", "--tasks", "/nonexistent/[t].jsonl"], "/nonexistent/[t].jsonl: no such"),
    (["tasks", "select", "--results", "/nonexistent/[r].jsonl", "--out", "o.jsonl"], "/nonexistent/[r].jsonl: cannot"),
    (["train", "--local", "--config", "/nonexistent/[c].json"], "/nonexistent/[c].json: cannot read it"),
    (["sft", "ship", "/nonexistent/ck[abc]"], "/nonexistent/ck[abc] is not a checkpoint"),
    (["tokenizer", "train", "--out", "full[abc]"], "--out full[abc] already holds files"),
]


@pytest.mark.parametrize("args, says", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_bracketed_user_text_survives_in_the_error_line(here, args, says):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr
