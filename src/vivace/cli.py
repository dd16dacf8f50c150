"""The `vivace` command. Each stage of the system is a subcommand; this file only wires them.

Commands that report numbers take `--json`; long work shows a progress bar on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from vivace import __version__
from vivace.config import PRESETS, SandboxConfig, ServerConfig, VivaceConfig, error_message, load_config

app = typer.Typer(help="vivace: train fast coding agents with RL in real sandboxed environments.", no_args_is_help=True)
sandbox_app = typer.Typer(help="Sandboxed workspaces (environment servers).", no_args_is_help=True)
config_app = typer.Typer(help="Run configuration and presets.", no_args_is_help=True)
tasks_app = typer.Typer(help="Benchmark and training tasks.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(config_app, name="config")
app.add_typer(tasks_app, name="tasks")

# emoji=False: rich reads ":x:" and ":up:" as emoji codes even in escaped text, so a model's `a[0:x:2]` was
# shown as `a[0❌2]`; nothing here is written with emoji codes.
err = Console(stderr=True, soft_wrap=True, emoji=False)  # error lines stay whole (greppable)
out = Console(emoji=False)


def print_json(obj: Any) -> None:
    """`--json` output: plain JSON on stdout, whatever the terminal or FORCE_COLOR (rich's print_json
    colours it then, and CI systems set FORCE_COLOR), ASCII-escaped so a file name that is not UTF-8
    (a lone surrogate here) comes out as a \\udcXX escape rather than a raw, invalid byte."""
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def fail(message: str, code: int = 2) -> NoReturn:
    """Exit `code` with one line on stderr, `error: MESSAGE`. The message is plain text, shown exactly as
    given: rich reads no markup in it (a path like runs/x[3], a glob [abc], a repr like ['a'] or a stray
    [/b] would be dropped or raise), no emoji codes (:100:) and colours none of its numbers or paths."""
    err.print(Text.assemble(("error:", "red"), " ", message))
    raise typer.Exit(code)


def seed_in_range(seed: int | None) -> int | None:
    """A --seed option's check (typer callback): torch.manual_seed takes 64 bits, and a larger seed fails
    deep in a run with "Overflow when unpacking long long"."""
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise typer.BadParameter(f"{seed} does not fit in 64 bits; give a seed from -2**63 to 2**63 - 1")
    return seed


class LoggedProgress(Progress):
    """rich's progress bar on stderr (default columns: description, bar, done/total, time). Where stderr is
    not a terminal (a log file, a pipe, CI) rich draws nothing until the end, so there it prints a plain
    line instead each time a task passes another tenth of its total."""

    def __init__(self, *columns, quiet: bool = False, **kwargs) -> None:
        columns = columns or (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self._plain = not quiet and not err.is_terminal
        super().__init__(*columns, console=err, disable=quiet or self._plain, **kwargs)
        self._tenths: dict = {}

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._line(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._line(task_id)

    def _line(self, task_id) -> None:
        task = self._tasks[task_id]
        if self._plain and task.total:
            tenth = int(task.completed * 10 // task.total)
            if tenth > self._tenths.get(task_id, 0):
                self._tenths[task_id] = tenth
                err.print(f"{task.description}: {task.completed:g}/{task.total:g}", markup=False, highlight=False)


PresetOpt = Annotated[str, typer.Option("--preset", help=f"Named preset: {', '.join(PRESETS)}.")]
BackendOpt = Annotated[str | None, typer.Option("--backend", help="auto | isolated | plain (plain is NOT isolated).")]
StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="Sandbox state directory.")]


ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="JSON or TOML file of sections merged over the preset.")
]


def status_say(status: Any) -> Callable[[str], None]:
    """What updates rich `status` (err.status) where stderr is a terminal; elsewhere (a log, a pipe),
    where rich draws no status, each update is printed as a line."""
    return status.update if err.is_terminal else lambda s: err.print(s, markup=False, highlight=False)


def sigterm_interrupts(received: list[int]):
    """For the block, SIGTERM (a scheduler's limit, `timeout`, `kill`) raises KeyboardInterrupt as Ctrl-C
    does, so the same clean-up and message follow; the signal is appended to `received` (exit 128 + it)."""
    import signal

    from vivace.signals import signal_handler

    def handler(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    return signal_handler(handler, (signal.SIGTERM,))


def run_cancelling_on_sigterm(received: list[int], coro):
    """asyncio.run(coro), where SIGTERM cancels it as asyncio's own Ctrl-C handling does (the episodes in
    flight are cancelled and their sandboxes closed; raising KeyboardInterrupt from a plain handler
    instead tears the loop down under its subprocesses). A SIGTERM appends to `received` and ends in
    CancelledError; a signal the process started with ignored (nohup) stays ignored."""

    async def main():
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        before = signal.getsignal(signal.SIGTERM)
        if before == signal.SIG_IGN:
            return await coro
        loop.add_signal_handler(signal.SIGTERM, lambda: (received.append(signal.SIGTERM), task.cancel()))
        try:
            return await coro
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            if before is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(signal.SIGTERM, before)

    return asyncio.run(main())


BACKENDS = ("auto", "isolated", "plain")


def with_sandbox_options(cfg: VivaceConfig, backend: str | None, state_dir: Path | None) -> VivaceConfig:
    """`--backend` and `--state-dir` over a config's sandbox section (unset options leave it as it is).
    A bad value is a ValueError naming the option; the state directory is made absolute, because the
    isolated backend hands paths under it to bwrap, which resolves a relative one elsewhere (every
    command then failed)."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"--backend {backend!r}: choose {', '.join(BACKENDS)} (plain is NOT isolated)")
        cfg.sandbox.backend = backend  # type: ignore[assignment]
    if state_dir is not None:
        cfg.sandbox.state_dir = state_dir
    given = Path(cfg.sandbox.state_dir).expanduser()
    if problem := path_problem(given, directory=True):
        raise ValueError(f"{'--state-dir' if state_dir is not None else 'sandbox.state_dir'} {problem}")
    cfg.sandbox.state_dir = given.absolute()
    return cfg


def path_problem(path: Path, directory: bool) -> str | None:
    """Why `path` cannot be written as a file (or, with `directory`, used as a directory): it is the other
    kind, or a parent of it is a file. None when it can. Checked before the work, so that a typo in
    --out does not end a long command with a traceback."""
    if path.exists():
        if directory and not path.is_dir():
            return f"{path} is a file; give a directory"
        if not directory and path.is_dir():
            return f"{path} is a directory; give a file path, e.g. {path / 'out.jsonl'}"
        return None
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return f"{path} cannot be made: {parent} is a file, not a directory; give a path in a directory"
    return None


def check_out(path: Path, directory: bool, option: str = "--out") -> None:
    """Exit 2 with one line when `path` cannot be written (path_problem)."""
    if problem := path_problem(path, directory):
        fail(f"{option}: {problem}")


def check_not_an_input(out: Path, inputs: list[Path], option: str = "--out") -> None:
    """Exit 2 when `out` is one of the command's input files: writing it would replace what it reads
    (`tasks select --results R --out R` replaced the bench results with tasks)."""
    for given in inputs:
        same = out.exists() and given.exists() and os.path.samefile(out, given)
        if same or out.absolute() == given.absolute():
            fail(f"{option} {out} is an input of this command ({given}); give another {option}")


def check_writable(path: Path, directory: bool, option: str = "--out") -> None:
    """check_out, then a file made and removed in the directory `path` goes to (the nearest one there is:
    permission bits alone do not say it for root, a read-only mount or a full disk): exit 2 with one line
    before the work, not a traceback after it."""
    check_out(path, directory, option)
    where = next(p for p in (path, *path.absolute().parents) if p.is_dir())
    if problem := write_problem(where):
        fail(f"{option} {path}: cannot write in {where} ({problem}); give a path you can write "
             "(check permissions, a read-only mount, free space)")  # fmt: skip


def write_problem(directory: Path) -> str | None:
    """Why a file cannot be made in `directory` (made, synced and removed: permission bits alone do not
    say it for root, a read-only mount or a full disk); None when it can."""
    try:
        with tempfile.TemporaryFile(dir=directory) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return str(e.strerror or e)
    return None


@contextlib.contextmanager
def writes_or_exit(path: Path, then: str) -> Iterator[None]:
    """For a block writing a command's output to `path`: an OSError (a disk that filled, a mount gone
    read-only) exits 1 with one line naming the file and the reason, then `then` (what to do next)."""
    try:
        yield
    except OSError as e:
        fail(f"cannot write {e.filename or path}: {e.strerror or e}; {then}", 1)


def stopped_by_signal(received: list[int], what: str) -> typer.Exit:
    """The message and exit (130 for Ctrl-C, 143 for SIGTERM) of a command stopped by a signal."""
    signum = received[-1] if received else signal.SIGINT
    err.print(f"[yellow]stopped by {signal.Signals(signum).name}:[/] {escape(what)}", soft_wrap=True, highlight=False)
    return typer.Exit(128 + signum)


def listening_socket(host: str, port: int):
    """A socket bound to `host`:`port` the way uvicorn binds one (SO_REUSEADDR; port 0 picks a free one),
    for a server to be handed (`uvicorn.Server.run(sockets=...)`), so that what was checked is what
    serves; ValueError saying why it cannot be (a name that does not resolve, an address this machine
    does not have, a port in use or not allowed). uvicorn itself only logs such a failure, after the
    app (and the model it serves) started."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"host {host!r} is no address or name this machine resolves ({e}); give e.g. 127.0.0.1 "
                         "or 0.0.0.0") from None  # fmt: skip
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        what = {errno.EADDRINUSE: "give another --port (0 picks a free one) or stop what holds it",
                errno.EADDRNOTAVAIL: "give an address of this machine, or 0.0.0.0 for all of them",
                errno.EACCES: "ports below 1024 need privileges; give one of 1024 or more"}.get(e.errno, "")  # fmt: skip
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}" + (f"; {what}" if what else "")) from None
    return sock


def bound_or_exit(host: str, port: int):
    """listening_socket, or exit 2 with one line saying why it cannot be."""
    try:
        return listening_socket(host, port)
    except ValueError as e:
        fail(str(e))


def _config(
    preset: str, backend: str | None = None, state_dir: Path | None = None, config_file: Path | None = None
) -> VivaceConfig:
    try:
        cfg = with_sandbox_options(load_config(preset, config_file), backend, state_dir)
    except (ValueError, OSError) as e:  # pydantic's ValidationError is a ValueError and names the field
        fail(str(e))
    return cfg


@app.command()
def version() -> None:
    """Print the vivace version."""
    out.print(__version__)


@config_app.command("show")
def config_show(
    preset: PresetOpt = "default",
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A .json or .toml file merged over the preset, as `vivace train --config` merges it: a bad "
            "setting is one line and exit 2 (train checks the suite and model it names when it starts).",
        ),
    ] = None,
) -> None:
    """Print a preset's full configuration as JSON (with --config, the file merged over it)."""
    print_json(_config(preset, config_file=config_file).model_dump(mode="json"))


AgentModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        help="Policy spec: tiny, a checkpoint directory, http(s)://HOST:PORT/v1#MODEL, "
        "tokens:http://HOST:PORT/v1#MODEL, scripted:null, scripted:replay:FILE.",
    ),
]


@app.command()
def agent(
    request: Annotated[str, typer.Argument(help="What the agent should do, in plain words.")],
    model: AgentModelOpt,
    repo: Annotated[
        Path, typer.Option("--repo", help="Repository to work on; it changes only with --apply or a yes.")
    ] = Path("."),
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", min=1, help="Assistant turns at most (default: the preset's).")
    ] = None,
    apply: Annotated[
        bool, typer.Option("--apply", help="Write the agent's changes into --repo without asking.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the trajectory as JSON instead of streaming turns.")
    ] = False,
    preset: PresetOpt = "default",
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Run the agent on REPO in a sandbox: streams each turn, then shows the final answer and the diff."""
    import signal

    from rich.prompt import Confirm

    from vivace.harness.agent import run_episode
    from vivace.harness.display import SHOWN_DIFF_LINES, EpisodePrinter, colour_diff, print_apply_report, visible
    from vivace.harness.policies import load_policy
    from vivace.harness.policy import close_policy
    from vivace.sandbox import SandboxError, SnapshotSource, open_backend
    from vivace.sandbox.apply import ApplyReport, export_changes
    from vivace.sandbox.diff import changed_paths, quote_path
    from vivace.sandbox.snapshot import enclosing_checkout
    from vivace.signals import signal_handler

    if not repo.is_dir():
        fail(f"--repo {repo} is not a directory; give the repository to work on with --repo DIR")
    cfg = _config(preset, backend, state_dir)
    try:
        if max_turns is not None:
            cfg.agent.max_turns = max_turns
        policy = load_policy(model, cfg.engine)
    except ValueError as e:
        fail(str(e))
    interactive = not as_json and sys.stdin.isatty()
    report = ApplyReport()  # filled as files are written: a Ctrl-C while applying still says which

    def confirmed() -> bool:
        try:
            return Confirm.ask(f"Apply these changes to {repo}?", console=out)
        except EOFError:  # Ctrl-D: a no, not click's "Aborted!" and exit 1
            out.print()
            return False

    sandbox: dict[str, object] = {}  # which backend ran the agent: --json says so (plain is NOT isolated)

    async def go():
        b = open_backend(cfg.sandbox)
        sandbox.update(backend=b.name, isolated=b.isolated)
        try:
            # Seconds on a big repository's first run, and synchronous: under asyncio's handler a Ctrl-C
            # would only be noticed after it (or lost), so here it stops the copy at once.
            with signal_handler(signal.default_int_handler):
                snap = b.snapshot(SnapshotSource(path=str(repo), enclosing_ignore_rules=True))
            if top := enclosing_checkout(repo):  # its ignore rules still decide what the diff leaves out
                err.print(
                    f"[yellow]warning:[/yellow] {escape(visible(str(repo)))} is inside the git repository"
                    f" {escape(visible(str(top)))}, not its top: the agent's copy has no .git, so git commands"
                    f" fail there; --repo {escape(visible(str(top)))} does not have that problem"
                )
            if snap.unreadable:  # the agent cannot see them, and --apply leaves them (it cannot read them either)
                shown = ", ".join(map(quote_path, snap.unreadable[:5])) + (", ..." * (len(snap.unreadable) > 5))
                err.print(
                    f"[yellow]warning:[/yellow] {len(snap.unreadable)} path(s) in {escape(visible(str(repo)))} cannot"
                    f" be read and are left out of the agent's copy: {escape(shown)}"
                )
            ws = await b.create(snap)
            observer = None if as_json else EpisodePrinter(out)
            try:
                traj = await run_episode(policy, ws, request, cfg.agent, observer=observer)
                diff, interrupted = traj.diff or "", False
            except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels this task, killing the command in flight
                if observer is not None:
                    observer.stop_waiting()
                if asyncio.current_task().uncancel():  # cancelled for another reason as well
                    raise
                # Nothing the agent did is lost: its changes so far are shown, and applied only after a yes
                # (a second Ctrl-C stops at once).
                traj, diff, interrupted = None, await ws.diff(), True
                if not as_json:
                    out.rule("[bold yellow]interrupted[/bold yellow]: the changes so far", align="left", style="dim")
                    out.print(colour_diff(diff, SHOWN_DIFF_LINES) if diff else "[dim](no changes)[/dim]")
            applied = False
            changed = bool(changed_paths(diff))  # a diff may be only a note (ignored files left out)
            # An episode the endpoint (or anything else) cut short by an error is as unfinished as an
            # interrupted one: --apply does not write its changes; at a terminal they are applied after a yes.
            unfinished = interrupted or cut_short(traj)
            if changed and ((apply and not unfinished) or (interactive and not received and confirmed())):
                await export_changes(ws, diff, repo, base=ws.snapshot.root, report=report)
                applied = True
            return traj, diff, applied, changed
        finally:
            await b.aclose()
            await close_policy(policy)

    received: list[int] = []  # SIGTERM (`timeout`, a job's limit) stops the episode as a first Ctrl-C does
    try:
        traj, diff, applied, changed = run_cancelling_on_sigterm(received, go())
    except SandboxError as e:
        fail(visible(str(e)))
    except KeyboardInterrupt:  # a second Ctrl-C, or one while applying
        if report.applied or report.left:  # nothing is written without being recorded
            print_apply_report(err, report, repo, stopped=True)
        else:
            err.print(f"[yellow]stopped:[/yellow] {escape(str(repo))} is unchanged", highlight=False)
        raise typer.Exit(130) from None
    if as_json:
        shown = {"trajectory": traj.model_dump()} if traj else {"interrupted": True, "diff": diff}
        done = {"applied": applied, "not_applied": report.left, "merged": report.merged, "sandbox": sandbox}
        sys.stdout.write(json.dumps({**shown, **done}) + "\n")
    elif applied:
        print_apply_report(out, report, repo)
    if traj is not None and traj.diff_failed:  # what the agent changed is unknown: never "no changes", never 0
        fail(f"{visible(traj.error or 'the workspace diff failed')}; {visible(str(repo))} is unchanged", code=1)
    if not as_json and not applied and changed:
        hint = ("an interrupted run is applied only after a yes" if traj is None else
                "the episode was cut short, so --apply left its changes" if apply and cut_short(traj)
                else "use --apply to write the changes")  # fmt: skip
        out.print(f"[dim]{repo} is unchanged ({escape(hint)})[/dim]")
    # 1 also when paths were left unapplied: a script's `--apply && git commit` must not take a
    # partly applied diff for the whole.
    failed = traj is not None and cut_short(traj) or bool(applied and report.left)
    raise typer.Exit((128 + received[-1] if received else 130) if traj is None else 1 if failed else 0)


def cut_short(traj) -> bool:
    """Whether an episode ended unfinished by a failure, not by the agent: an error (the endpoint's
    included), the wall clock running out with the endpoint still to answer (a dead server, which
    exited 0 after 30 silent minutes), or a context limit met before any turn (a reply budget the
    model's context cannot hold: nothing ran)."""
    from vivace.harness.agent import WAITING_FOR_POLICY

    waited = traj.stop_reason == "timeout" and (traj.error or "").endswith(WAITING_FOR_POLICY)
    never_fit = traj.stop_reason == "max_tokens" and not traj.turns
    return traj.stop_reason == "error" or waited or never_fit


@app.command()
def tools(as_json: Annotated[bool, typer.Option("--json", help="Print the tool schemas as JSON.")] = False) -> None:
    """List the agent's tools and their argument schemas (what the model sees)."""
    from vivace.harness.tools import default_tools
    from vivace.harness.tools.base import tool_schema

    schemas = [tool_schema(t) for t in default_tools()]
    if as_json:
        sys.stdout.write(json.dumps(schemas, indent=1) + "\n")
        return
    table = Table(show_lines=True)
    for col in ("tool", "arguments", "description"):
        table.add_column(col)
    for s in schemas:
        fn = s["function"]
        required = set(fn["parameters"].get("required", []))
        args = "\n".join(
            f"{k}{'' if k in required else '?'}: {_type_name(v)}" for k, v in fn["parameters"]["properties"].items()
        )
        table.add_row(fn["name"], escape(args), escape(fn["description"]))  # `[abc]` in a glob is not markup
    out.print(table)


def _type_name(prop: dict) -> str:
    if "type" in prop:
        return prop["type"] if prop["type"] != "array" else f"list[{_type_name(prop.get('items', {}))}]"
    options = [_type_name(p) for p in prop.get("anyOf", []) if p.get("type") != "null"]
    return " | ".join(options) or ("enum" if "enum" in prop else "any")


@sandbox_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sandbox_run(
    ctx: typer.Context,
    repo: Annotated[Path, typer.Option("--repo", help="Directory, tarball or git repository to start from.")],
    commit: Annotated[str | None, typer.Option(help="Git revision (makes --repo a git snapshot).")] = None,
    keep_diff: Annotated[bool, typer.Option("--keep-diff", help="Print the workspace diff after the command.")] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Wall-clock limit, seconds (default: the preset's sandbox.timeout_s, "
            f"{SandboxConfig.model_fields['timeout_s'].default:g} s in the default preset)."
        ),
    ] = None,
    preset: PresetOpt = "default",
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Run a command in a fresh workspace over REPO: `vivace sandbox run --repo DIR -- CMD...`."""
    from vivace.sandbox import SandboxError, SnapshotSource, open_backend

    cmd = list(ctx.args)
    if not cmd:
        fail("no command given; usage: vivace sandbox run --repo DIR -- CMD...")
    if timeout is not None and not timeout > 0:
        fail(f"--timeout {timeout:g}: give a number of seconds above 0 (or leave it out)")
    if not repo.exists():
        fail(f"--repo {repo} does not exist; give a directory, a tarball or a git repository")
    cfg = _config(preset, backend, state_dir)

    async def go() -> int:
        b = open_backend(cfg.sandbox)
        try:
            ws = await b.create(b.snapshot(SnapshotSource(path=str(repo), commit=commit)))
            result = await ws.exec(cmd, timeout=timeout)
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            if result.timed_out:
                err.print(f"[yellow]timed out after {result.duration_s:.1f}s[/yellow]")
            if result.oom_killed:
                err.print("[yellow]a process was killed by the memory limit[/yellow]")
            if keep_diff:
                sys.stdout.write(await ws.diff())
            return result.exit_code
        finally:
            await b.aclose()

    received: list[int] = []  # SIGTERM kills the command and closes the workspace, as Ctrl-C does
    try:
        code = run_cancelling_on_sigterm(received, go())
    except SandboxError as e:
        fail(str(e))
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise stopped_by_signal(received, "the command was killed and its workspace removed") from None
    raise typer.Exit(code)


@sandbox_app.command("bench")
def sandbox_bench(
    n: Annotated[int, typer.Option("--n", min=1, help="Workspaces per backend (all live at once).")] = 100,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Workspaces created at the same time.")] = 16,
    files: Annotated[int, typer.Option("--files", min=0, help="Files in the generated repository.")] = 2000,
    baseline: Annotated[bool, typer.Option(help="Also measure the full-copy (plain) baseline.")] = True,
    baseline_n: Annotated[
        int, typer.Option("--baseline-n", min=1, help="Workspaces for the full-copy baseline (it is slow).")
    ] = 100,
    scaling: Annotated[
        str | None, typer.Option(help="Instead: exec latency with N live workspaces, e.g. 0,100,500.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON.")] = False,
    preset: PresetOpt = "default",
    state_dir: StateOpt = None,
) -> None:
    """Measure workspace creation + first command: isolated overlay vs full copy, side by side."""
    if scaling is not None:
        _bench_scaling(scaling, files, as_json, _config(preset, None, state_dir))
        return
    from vivace.sandbox.bench import run_bench
    from vivace.sandbox.isolated import probe

    cfg = _config(preset, None, state_dir)
    backends = tuple(b for b in ("isolated", "plain") if b != "plain" or baseline)
    if (problem := probe()) is not None:
        err.print(
            f"[yellow]isolated backend unavailable ({escape(problem)}); measuring the plain backend only[/yellow]"
        )
        backends = ("plain",)
    progress = LoggedProgress()

    def factory(name: str, total: int):
        task = progress.add_task(f"{name:>8}", total=total)
        return lambda k: progress.advance(task, k)

    repo_dir = cfg.sandbox.state_dir / "bench-repo"
    with progress:
        results = asyncio.run(run_bench(cfg.sandbox, n, concurrency, files, repo_dir, backends, factory, baseline_n))
    if as_json:
        print_json(results)
        return
    table = Table(title=f"concurrency {concurrency}, {files}-file repo")
    table.add_column("backend")
    table.add_column("n", justify="right")
    for col in ("first cmd p50", "p99", "alone p50", "throughput/s", "disk/ws", "failures"):
        table.add_column(col, justify="right")
    for name in backends:
        r = results[name]
        table.add_row(
            name, str(r["n"]), f"{r['first_command_ms']['p50']:.1f} ms", f"{r['first_command_ms']['p99']:.1f} ms",
            f"{r['first_command_alone_ms']['p50']:.1f} ms", f"{r['throughput_per_s']:.1f}",
            f"{r['disk_bytes_per_workspace'] / 1024:.0f} KiB", str(r["failures"]),
        )  # fmt: skip
    out.print(table)
    if ratio := results.get("ratio_plain_over_isolated"):
        out.print(
            f"isolated vs full copy: first command {_times(ratio['first_command_p50'])} (p50), "
            f"{_times(ratio['first_command_alone_p50'])} alone; throughput {ratio['throughput']:.1f}x the full copy's"
        )


def _times(plain_over_isolated: float) -> str:
    """A time ratio said the way it goes: "3.2x faster", or "2.0x slower" (not "0.5x faster")."""
    if plain_over_isolated >= 1:
        return f"{plain_over_isolated:.1f}x faster"
    return f"{1 / plain_over_isolated:.1f}x slower" if plain_over_isolated > 0 else "no time to compare"


def _bench_scaling(steps_text: str, files: int, as_json: bool, cfg: VivaceConfig) -> None:
    from vivace.sandbox.bench import bench_scaling, generate_repo
    from vivace.sandbox.isolated import IsolatedBackend

    try:
        steps = [int(x) for x in steps_text.split(",") if x.strip()]
        if not steps or min(steps) < 0:
            raise ValueError
    except ValueError:
        fail(f"--scaling wants comma-separated counts of 0 or more like 0,100,500, not {steps_text!r}")

    async def go() -> dict:
        backend = IsolatedBackend(cfg.sandbox.model_copy(update={"backend": "isolated"}))
        try:
            repo = generate_repo(cfg.sandbox.state_dir / "bench-repo", files)
            return await bench_scaling(backend, repo, steps)
        finally:
            await backend.aclose()

    with err.status("measuring exec latency against live workspaces..."):
        results = asyncio.run(go())
    if as_json:
        print_json(results)
        return
    table = Table(title="exec latency (one at a time) with N live workspaces")
    for col in ("live", "p50", "p90"):
        table.add_column(col, justify="right")
    for n, r in results.items():
        table.add_row(n, f"{r['exec_p50_ms']:.1f} ms", f"{r['exec_p90_ms']:.1f} ms")
    out.print(table)


@sandbox_app.command("serve")
def sandbox_serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help=f"TCP port (default: the config's server.port, {ServerConfig.model_fields['port'].default})."
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="Bearer token (default: $VIVACE_SANDBOX_TOKEN or random). Prefer the variable: other users of "
            "the machine can read a command line (ps)."
        ),
    ] = None,
    preset: PresetOpt = "default",
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    config_file: ConfigOpt = None,
) -> None:
    """Serve workspaces over HTTP (token-authenticated, loopback by default)."""
    from pydantic import ValidationError

    from vivace.sandbox.server import serve

    cfg = _config(preset, backend, state_dir, config_file)
    updates = {k: v for k, v in {"host": host, "port": port, "token": token}.items() if v is not None}
    try:  # the config file's values were checked as it loaded: a bad one here is an option's
        cfg.server = ServerConfig.model_validate({**cfg.server.model_dump(), **updates})
    except ValidationError as e:
        # No value in the message: --token is a secret.
        problems = "; ".join(f"--{x['loc'][0]}: {error_message(x)}" for x in e.errors())
        fail(problems)
    serve(cfg, bound_or_exit(cfg.server.host, cfg.server.port))


def main() -> None:
    app()


import vivace.cli_bench  # noqa: E402,F401  (registers `tasks generate` and `bench` on the app)
import vivace.cli_index  # noqa: E402,F401  (registers `index build|search|bench|train-embedder` on the app)
import vivace.cli_model  # noqa: E402,F401  (registers `tokenizer train` on the app)
import vivace.cli_serve  # noqa: E402,F401  (registers `serve` and `serve bench` on the app)
import vivace.cli_sft  # noqa: E402,F401  (registers `sft data` on the app)
import vivace.cli_train  # noqa: E402,F401  (registers `train` and `train bench-pipeline` on the app)

if __name__ == "__main__":  # `python -m vivace.cli`: run the imported module's app, on which the commands registered
    from vivace.cli import main as _registered_main

    _registered_main()
