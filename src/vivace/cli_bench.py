"""`vivace tasks generate` and `vivace bench`: the benchmark's commands (registered on the app
in cli.py, kept here so cli.py stays a readable index of the sandbox and agent commands)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from vivace.cli import (
    BackendOpt,
    ConfigOpt,
    LoggedProgress,
    PresetOpt,
    StateOpt,
    _config,
    app,
    check_not_an_input,
    check_out,
    check_writable,
    err,
    fail,
    out,
    print_json,
    seed_in_range,
    sigterm_interrupts,
    stopped_by_signal,
    tasks_app,
    writes_or_exit,
)


@tasks_app.command("generate")
def tasks_generate(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for tasks.jsonl and one file per split.")],
    n: Annotated[int, typer.Option("--n", min=1, help="Bug tasks to keep.")] = 100,
    seed: Annotated[int, typer.Option(callback=seed_in_range, help="Seed: the same seed gives the same tasks.")] = 0,
    repos: Annotated[str | None, typer.Option(help="Comma-separated bundled repositories (default: all).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Mutants tested at the same time.")] = 2,
    preset: PresetOpt = "default",
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the tasks files an earlier run left in --out.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Inject bugs into the bundled repositories; keep those the tests catch; write the tasks."""
    from vivace.sandbox import open_backend
    from vivace.tasks.format import BUNDLED_REPOS, bundled_repos, save_jsonl
    from vivace.tasks.generate import generate

    check_writable(out_dir, directory=True)
    if (out_dir / "tasks.jsonl").exists() and not force:  # said before minutes of work, not replaced after them
        fail(f"--out {out_dir} already holds tasks (tasks.jsonl and its split files); give another --out, remove them "
             "first, or add --force to replace them")  # fmt: skip
    cfg = _config(preset, backend, state_dir)
    names = list(dict.fromkeys(r.strip() for r in repos.split(","))) if repos else bundled_repos()  # each once
    unknown = sorted(set(names) - set(bundled_repos()))
    if unknown:
        fail(f"unknown repositories {unknown}; bundled: {', '.join(bundled_repos())}")
    progress = LoggedProgress()
    bar = progress.add_task("tasks kept", total=n)

    def report(kept: int, tried: int) -> None:
        progress.update(bar, completed=kept, description=f"tasks kept ({tried} mutants tried)")

    async def go():
        b = open_backend(cfg.sandbox)
        snapshots: dict = {}

        @asynccontextmanager
        async def workspace(repo: str):
            if repo not in snapshots:
                snapshots[repo] = await asyncio.to_thread(b.snapshot, str(BUNDLED_REPOS / repo))
            ws = await b.create(snapshots[repo])
            try:
                yield ws
            finally:
                await ws.close()

        try:
            return await generate(workspace, n, seed, names, concurrency, report)
        finally:
            await b.aclose()

    received: list[int] = []
    try:
        with progress, sigterm_interrupts(received):  # SIGTERM as Ctrl-C: the sandbox backend is closed
            tasks = asyncio.run(go())
    except RuntimeError as e:
        fail(str(e), 1)
    except KeyboardInterrupt:
        raise stopped_by_signal(received, f"nothing was written to {out_dir}; `tasks generate` does not resume: run "
                                "it again") from None  # fmt: skip
    counts = {}
    with writes_or_exit(out_dir, f"the {len(tasks)} tasks generated were not saved; give an --out you can write and "
                        "run it again"):  # fmt: skip
        out_dir.mkdir(parents=True, exist_ok=True)
        save_jsonl(tasks, out_dir / "tasks.jsonl")
        for split in ("train", "validation", "test"):
            chosen = [t for t in tasks if t.split == split]
            save_jsonl(chosen, out_dir / f"{split}.jsonl")
            counts[split] = len(chosen)
    if as_json:
        report = {"tasks": len(tasks), "splits": counts, "out": str(out_dir / "tasks.jsonl")}
        sys.stdout.write(json.dumps(report) + "\n")
        return
    out.print(f"wrote {len(tasks)} tasks to {out_dir / 'tasks.jsonl'} (by split: {counts})")


@tasks_app.command("families")
def tasks_families(
    out_file: Annotated[Path, typer.Option("--out", help="JSONL file to write.")],
    train: Annotated[int, typer.Option(min=0, help="Training tasks (themes of the train split).")] = 840,
    validation: Annotated[int, typer.Option(min=0, help="Validation tasks.")] = 70,
    test: Annotated[int, typer.Option(min=0, help="Held-out test tasks (themes never seen in training).")] = 210,
    seed: Annotated[int, typer.Option(callback=seed_in_range, help="Seed: the same seed gives the same tasks.")] = 0,
    workers: Annotated[int, typer.Option(min=1, help="Test runs at the same time.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Generate the learnable task families (small projects, bugs the tools reveal), validated by
    running their tests; spread evenly over families and curriculum levels."""
    from vivace.tasks.families import generate_families
    from vivace.tasks.format import save_jsonl

    wanted = {"train": train, "validation": validation, "test": test}
    if not any(wanted.values()):
        fail("no tasks asked for: give --train, --validation or --test above 0")
    check_writable(out_file, directory=False)
    progress = LoggedProgress()
    bar = progress.add_task("tasks kept", total=sum(wanted.values()))
    received: list[int] = []
    try:
        with progress, sigterm_interrupts(received):  # SIGTERM as Ctrl-C: the test runs in flight end and clean up
            tasks = generate_families({k: v for k, v in wanted.items() if v > 0}, seed, workers=workers,
                                      progress=lambda kept, total: progress.update(bar, completed=kept))  # fmt: skip
    except KeyboardInterrupt:
        raise stopped_by_signal(received, f"nothing was written to {out_file}; run it again") from None
    except RuntimeError as e:  # a clean project fails: the environment cannot run the tests
        fail(f"{e}\nnothing was written to {out_file}; the projects' tests run with this Python's pytest", 1)
    with writes_or_exit(out_file, f"the {len(tasks)} tasks generated were not saved; give an --out you can write and "
                        "run it again"):  # fmt: skip
        out_file.parent.mkdir(parents=True, exist_ok=True)
        save_jsonl(tasks, out_file)
    counts: dict[str, int] = {}
    for t in tasks:
        key = f"{t.split}/{t.metadata['family']}"
        counts[key] = counts.get(key, 0) + 1
    if as_json:  # one document (the text line below, then the counts, are two)
        report = {"tasks": len(tasks), "counts": dict(sorted(counts.items())), "out": str(out_file)}
        sys.stdout.write(json.dumps(report) + "\n")
        return
    out.print(f"wrote {len(tasks)} tasks to {out_file}")
    out.print_json(json.dumps(dict(sorted(counts.items()))))


@tasks_app.command("swebench")
def tasks_swebench(
    records: Annotated[Path, typer.Argument(help="SWE-bench-style JSONL: one record per line.")],
    repos: Annotated[
        list[str],
        typer.Option(
            "--repos",
            help="A directory of local clones (named owner__name or name), or OWNER/NAME=PATH; repeat for several.",
        ),
    ],
    out_file: Annotated[Path, typer.Option("--out", help="Tasks file to write (for bench --tasks or train.suite).")],
    test_command: Annotated[
        str | None, typer.Option(help="Test command (the test files are appended); default: pytest.")
    ] = None,
    setup: Annotated[
        list[str] | None, typer.Option("--setup", help="A command run in the workspace first; repeat for several.")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE for every command in the workspace; repeat.")
    ] = None,
    repo_config: Annotated[
        Path | None,
        typer.Option(
            help='JSON {"OWNER/NAME": {"test_command": ..., "setup": [...], "env": {...}}}: each repository\'s own, '
            "after the options above (its setup runs after theirs; its variables and test command win).",
        ),
    ] = None,
    split: Annotated[str, typer.Option(help="Split written into each task (train, validation, test).")] = "test",
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Run the reference fix and no change on each task in a sandbox; write only the tasks where the "
            "fix passes and no change fails (episodes in OUT's folder, NAME-check/).",
        ),
    ] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="--check: episodes at the same time.")] = 2,
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")] = False,
) -> None:
    """Turn SWE-bench-style records into vivace tasks against local clones: the repository at the
    base commit, the issue as the request, the test patch's files as the hidden tests."""
    from vivace.sandbox.base import check_env
    from vivace.tasks.format import TaskFormatError, save_jsonl
    from vivace.tasks.swebench import load_repo_runs, load_swebench_jsonl

    check_not_an_input(out_file, [records, *([repo_config] if repo_config else [])])
    check_writable(out_file, directory=False)
    try:
        if split not in ("train", "validation", "test"):
            raise ValueError(f"unknown split {split!r}; use train, validation or test")
        clones = _repo_dirs(repos)
        variables = check_env(_assignments(env or [], "--env"))
        repo_runs = load_repo_runs(repo_config) if repo_config else None
        progress = LoggedProgress()
        bar = progress.add_task("records", total=None)
        with progress:
            tasks = load_swebench_jsonl(
                records, clones, test_command=test_command, setup=setup or [], env=variables, split=split,
                repo_runs=repo_runs, progress=lambda done, total: progress.update(bar, completed=done, total=total),
            )  # fmt: skip
    except (ValueError, TaskFormatError) as e:
        fail(str(e))
    if not tasks:
        fail(f"{records} holds no records; nothing written")
    unsound: dict[str, str] = {}
    if check:
        check_dir = out_file.parent / f"{out_file.stem}-check"
        unsound = _check_tasks(tasks, _config("default", backend, state_dir), check_dir, concurrency)
        tasks = [t for t in tasks if t.id not in unsound]
        for task_id, why in unsound.items():
            err.print(f"left out {task_id}: {why}", markup=False, highlight=False)
        if not tasks:
            if as_json:  # a script reading stdout still learns why each was left out
                print_json({"tasks": 0, "repos": {}, "out": None, "left_out": unsound})
            fail(f"no task passed the check; nothing written (episodes in {check_dir})", 1)
    with writes_or_exit(out_file, f"the {len(tasks)} tasks were not saved; give an --out you can write and run "
                        "the command again"):  # fmt: skip
        out_file.parent.mkdir(parents=True, exist_ok=True)
        save_jsonl(tasks, out_file)
    by_repo: dict[str, int] = {}
    for t in tasks:
        by_repo[t.metadata["repo"]] = by_repo.get(t.metadata["repo"], 0) + 1
    if as_json:
        report = {"tasks": len(tasks), "repos": dict(sorted(by_repo.items())), "out": str(out_file)}
        print_json({**report, **({"left_out": unsound} if check else {})})
        return
    if check:
        out.print(f"checked: the reference fix passes and no change fails in {len(tasks)} of {len(tasks) + len(unsound)} "
                  f"tasks (episodes in {check_dir})")  # fmt: skip
    out.print(f"wrote {len(tasks)} tasks from {len(by_repo)} repositories to {out_file}")


def _check_tasks(tasks: list, cfg, out_dir: Path, concurrency: int) -> dict[str, str]:
    """Task id -> why it is unsound, from one episode each of the reference fix and of no change."""
    from vivace.bench.report import NULL, ORACLE, task_problems
    from vivace.bench.runner import run_benchmark

    (out_dir / "results.jsonl").unlink(missing_ok=True)  # run_benchmark appends: keep only this check's rows
    progress = LoggedProgress()
    bar = progress.add_task("checking tasks (episodes)", total=2 * len(tasks))
    with progress:
        rows = asyncio.run(run_benchmark([ORACLE, NULL], tasks, cfg, out_dir, concurrency,
                                         lambda row: progress.advance(bar)))  # fmt: skip
    problems = task_problems(rows, tasks)
    return {t.id: problems[t.id] for t in tasks if t.id in problems}


def _repo_dirs(values: list[str]) -> dict[str, str] | str:
    """--repos: one directory of clones, or OWNER/NAME=PATH pairs (not both)."""
    pairs = [v for v in values if "=" in v]
    if not pairs:
        if len(values) != 1:
            raise ValueError("--repos: give one directory of clones, or OWNER/NAME=PATH for each repository")
        if not Path(values[0]).is_dir():  # else every record is "no clone found", naming paths under it
            what = "is not a directory" if Path(values[0]).exists() else "does not exist"
            raise ValueError(f"--repos {values[0]} {what}; give the directory holding the clones (named owner__name "
                             "or name), or OWNER/NAME=PATH for each repository")  # fmt: skip
        return values[0]
    if len(pairs) != len(values):
        raise ValueError("--repos: give one directory of clones, or only OWNER/NAME=PATH pairs, not both")
    return _assignments(values, "--repos")


def _assignments(values: list[str], option: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise ValueError(f"{option}: expected KEY=VALUE, got {v!r}")
        if key in result:
            raise ValueError(f"{option}: {key!r} given twice")
        result[key] = value
    return result


@tasks_app.command("select")
def tasks_select(
    results: Annotated[
        list[Path], typer.Option("--results", help="results.jsonl of `vivace bench` runs; repeat to pool several.")
    ],
    out_file: Annotated[Path, typer.Option("--out", help="Tasks file to write (a train.suite).")],
    suite: Annotated[str, typer.Option(help="Suite name or tasks path the results were measured on.")] = "families",
    split: Annotated[str, typer.Option(help="Only this split (train, validation, test), or all.")] = "train",
    model: Annotated[str | None, typer.Option(help="Only rows of this policy spec (needed if results mix).")] = None,
    min_solved: Annotated[int, typer.Option(min=0, help="Keep tasks solved at least this often.")] = 1,
    max_rate: Annotated[float, typer.Option(min=0, max=1, help="Keep tasks solved at most this share.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts per family as JSON.")] = False,
) -> None:
    """Keep the tasks a policy solved at least --min-solved times and at most --max-rate of the time
    (pass-rate filtering), measured by `vivace bench --samples K`. RL learns only from groups whose
    rollouts differ in outcome: a --max-rate below 1 also leaves out the tasks it always solves."""
    from vivace.tasks.format import TaskFormatError, save_jsonl
    from vivace.tasks.select import read_pass_rates, select_tasks
    from vivace.tasks.suites import load_suite

    check_not_an_input(out_file, [*results, Path(suite)])
    check_writable(out_file, directory=False)
    try:
        tasks = load_suite(suite, None if split == "all" else split)
        rates = read_pass_rates(results, model)
    except (ValueError, TaskFormatError) as e:
        fail(str(e))
    if not rates:
        where = ", ".join(map(str, results))
        fail(f"no result rows{f' for model {model!r}' if model else ''} in {where}")
    chosen = select_tasks(tasks, rates, min_solved, max_rate)
    known = {t.id for t in tasks}
    counts: dict[str, dict[str, int]] = {}
    for t in tasks:
        c = counts.setdefault(t.family, {"tasks": 0, "measured": 0, "solved_sometimes": 0, "kept": 0})
        c["tasks"] += 1
        if (r := rates.get(t.id)) is not None:
            c["measured"] += 1
            c["solved_sometimes"] += 0 < r.solved < r.episodes
    for t in chosen:
        counts[t.family]["kept"] += 1
    report = {
        "kept": len(chosen),
        "tasks": len(tasks),
        "measured": sum(c["measured"] for c in counts.values()),
        "episodes": sum(r.episodes for r in rates.values()),
        "results_not_in_suite": len(set(rates) - known),
        "families": dict(sorted(counts.items())),
        "out": str(out_file),
    }
    if not report["measured"]:  # "no task meets the bounds" would send the user lowering them
        where = f"suite {suite}" + (f", split {split}" if split != "all" else "")
        fail(f"none of the {len(rates)} tasks in the results is in {where}; give the --suite (and --split) the "
             "results were measured on")  # fmt: skip
    if not chosen:
        fail("no task meets the bounds; nothing written (lower --min-solved or measure more)", 1)
    with writes_or_exit(out_file, "nothing was written; give an --out you can write"):
        out_file.parent.mkdir(parents=True, exist_ok=True)
        save_jsonl(chosen, out_file)
    if as_json:
        print_json(report)
        return
    for family, c in report["families"].items():
        out.print(f"{family:>24}: kept {c['kept']:>3} of {c['measured']:>3} measured ({c['tasks']} in the suite)")
    if report["results_not_in_suite"]:
        err.print(
            f"[yellow]{report['results_not_in_suite']} measured tasks are not in {escape(suite)} ({split})[/yellow]"
        )
    out.print(f"wrote {len(chosen)} tasks to {out_file}")


def _warn_unsound(problems: dict[str, str], advice: str, out_dir: Path) -> None:
    """One line on the tasks the scripted baselines show to be unsound here (task_problems), so that a
    success rate of 0 does not have to explain itself; all of them are in the report and unsound.json."""
    if problems:
        task_id, why = next(iter(problems.items()))
        err.print(
            f"[yellow]warning:[/] {len(problems)} task(s) are unsound in this environment (e.g. {escape(task_id)}: "
            f"{escape(why)}); each, with why, is listed in {escape(str(out_dir / 'report.md'))} and unsound.json; "
            f"{escape(advice)}.",
            highlight=False,
            soft_wrap=True,
        )


@app.command("bench")
def bench(
    model: Annotated[list[str], typer.Option("--model", help="Policy spec; repeat to compare several.")],
    suite: Annotated[str | None, typer.Option(help="Named suite: bundled, bugs, features, families.")] = None,
    tasks_path: Annotated[Path | None, typer.Option("--tasks", help="Tasks: a .jsonl file or task directory.")] = None,
    split: Annotated[str | None, typer.Option(help="Only this split (train, validation, test).")] = None,
    n: Annotated[int | None, typer.Option("--n", min=1, help="First N tasks only.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes at the same time.")] = 4,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory (default runs/bench-TIME).")] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in --out with the same options: run only its episodes that did not finish "
            "or failed to run (same seeds), then report them all.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-model summary as JSON.")] = False,
    temperature: Annotated[
        float | None, typer.Option(help="Sampling temperature of model policies (default: the preset's engine).")
    ] = None,
    samples: Annotated[int, typer.Option(min=1, help="Episodes per task and model (sampled policies vary).")] = 1,
    preset: PresetOpt = "default",
    config_file: ConfigOpt = None,
    backend: BackendOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Run models on tasks in sandboxes and score them: correctness, adherence, efficiency, claims."""
    from vivace.bench.report import html_report, markdown, summarize, task_problems, unsound_advice
    from vivace.bench.runner import SetupError, TaskError, read_results, run_benchmark, run_settings, start_run
    from vivace.harness.policies import load_policy
    from vivace.tasks.format import TaskFormatError, check_split, load_tasks
    from vivace.tasks.suites import load_suite

    cfg = _config(preset, backend, state_dir, config_file)
    if temperature is not None:
        if not 0 <= temperature < float("inf"):  # NaN too
            fail(f"--temperature {temperature:g}: give 0 (greedy) or more")
        cfg.engine.temperature = temperature
    if resume and out_dir is None:  # a fresh run in a new runs/bench-TIME is not what was asked for
        fail("--resume needs --out RUN (the run to continue)")
    if out_dir is not None:
        check_out(out_dir, directory=True)
    if (suite is None) == (tasks_path is None):
        fail("give exactly one of --suite NAME and --tasks PATH")
    try:
        if twice := sorted({m for m in model if model.count(m) > 1}):
            raise ValueError(f"--model {', '.join(twice)} given more than once (use --samples for more episodes)")
        for m in model:
            load_policy(m)
        check_split(split)
        tasks = load_suite(suite, split) if suite else load_tasks(tasks_path)  # type: ignore[arg-type]
    except (ValueError, TaskFormatError) as e:
        fail(str(e))
    if tasks_path and split:
        tasks = [t for t in tasks if t.split == split]
    tasks = tasks[:n] if n else tasks
    if not tasks:
        fail(f"no tasks selected from {suite or tasks_path}{f' in split {split!r}' if split else ''}")
    out_dir = out_dir or Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S")
    try:
        finished = start_run(out_dir, run_settings(model, tasks, cfg, samples), resume)
    except ValueError as e:
        fail(str(e))
    except OSError as e:  # a directory that cannot be made or written here
        fail(f"cannot write the run in --out {out_dir}: {e.strerror or e}; give a directory you can write")
    if finished:
        err.print(f"resuming {out_dir}: {len(finished)} episodes already finished", markup=False, highlight=False)
    progress = LoggedProgress()
    bar = progress.add_task("episodes", total=len(tasks) * len(model) * samples, completed=len(finished))
    solved = [sum(bool(r.get("resolved")) for r in finished)]
    again = f"continue with the same options and --out {out_dir} --resume"

    def done(row: dict) -> None:
        solved[0] += bool(row.get("resolved"))
        progress.update(bar, advance=1, description=f"episodes ({solved[0]} solved)")

    t0 = time.monotonic()
    title = f"vivace bench: {suite or tasks_path} ({len(tasks)} tasks{f' x {samples} samples' if samples > 1 else ''})"
    received: list[int] = []
    try:
        with progress, sigterm_interrupts(received):
            rows = asyncio.run(run_benchmark(model, tasks, cfg, out_dir, concurrency, done, samples, finished=finished))
    except SetupError as e:  # a policy's engine (its device), the tokenizer or the backend: before any episode
        fail(str(e))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: report the episodes that finished (results.jsonl has each)
        results = out_dir / "results.jsonl"
        rows = read_results(results) if results.is_file() else []
        stopped = f"stopped after {len(rows)} of {progress.tasks[bar].total:.0f} episodes"
        if rows:
            (out_dir / "report.md").write_text(markdown(summarize(rows), f"{title}, {stopped}"))
            err.print(f"[yellow]{stopped}:[/] the report of those is {escape(str(out_dir / 'report.md'))}; "
                      f"{escape(again)}", soft_wrap=True)  # fmt: skip
        else:
            err.print(f"[yellow]{stopped}:[/] {escape(again)}", soft_wrap=True)
        if as_json:
            report = {"summary": summarize(rows), "out_dir": str(out_dir), "interrupted": True}
            sys.stdout.write(json.dumps({**report, "seconds": time.monotonic() - t0}) + "\n")
        raise typer.Exit(128 + (received[-1] if received else signal.SIGINT)) from None
    seconds = time.monotonic() - t0
    summary = summarize(rows)
    unsound = task_problems(rows, tasks)
    advice = unsound_advice(rows, unsound)
    (out_dir / "report.md").write_text(markdown(summary, title, unsound, advice))
    (out_dir / "report.html").write_text(html_report(summary, title, unsound, advice))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))  # model -> stats, nothing else
    (out_dir / "unsound.json").write_text(json.dumps(unsound, indent=1))  # task id -> why ({} when none)
    _warn_unsound(unsound, advice, out_dir)
    task_error = f"{TaskError.__name__}: "  # how the runner's row names the exception
    task_failed = [r for r in rows if r.get("error", "").startswith(task_error)]
    if ids := sorted({r["task_id"] for r in task_failed} - set(unsound)):  # the unsound ones are named above
        first = next(r["error"] for r in task_failed if r["task_id"] == ids[0]).removeprefix(task_error)
        err.print(f"[yellow]warning:[/] {len(ids)} task(s) could not start here and are not counted in success "
                  f"({escape(', '.join(ids[:5]))}{', ...' if len(ids) > 5 else ''}; e.g. {escape(ids[0])}: "
                  f"{escape(first)}); fix the task's repo, "
                  f"patch or setup in its file (results.jsonl has each error), then {escape(again)}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if failed := [r for r in rows if "error" in r and not r["error"].startswith(task_error)]:
        err.print(f"[yellow]warning:[/] {len(failed)} episode(s) could not run and are not counted in success (e.g. "
                  f"{escape(failed[0]['task_id'])}: {escape(failed[0]['error'])}); to run them again, {escape(again)}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if crashed := [r for r in rows if r.get("details", {}).get("stop_reason") == "error"]:
        err.print(f"[yellow]warning:[/] {len(crashed)} episode(s) ended in an error of the policy and count as "
                  f"failures (e.g. {escape(crashed[0]['task_id'])}); each trajectory's `error` says what failed "
                  f"({escape(str(out_dir / crashed[0]['trajectory']))})", highlight=False, soft_wrap=True)  # fmt: skip
    if as_json:
        sys.stdout.write(json.dumps({"summary": summary, "unsound_tasks": unsound, "out_dir": str(out_dir),
                                     "seconds": seconds}) + "\n")  # fmt: skip
    else:
        # Whole lines, no markup: the table must stay Markdown when stdout is a file or a pipe.
        out.print(markdown(summary, title, unsound, advice), soft_wrap=True, markup=False, highlight=False)
        out.print(f"report: {out_dir / 'report.html'} ({seconds:.0f} s)", soft_wrap=True, markup=False, highlight=False)
    # A model none of whose episodes could run (its endpoint down) measured nothing: a script must see that.
    if unmeasured := [m for m in model if all("error" in r for r in rows if r.get("model") == m)]:
        if rows and all(r["error"].startswith(task_error) for r in rows if r.get("model") in unmeasured):
            # the tasks, not the model: running them again as they are would fail the same way
            fail(f"no episode of {', '.join(unmeasured)} could run: no task could start (e.g. {rows[0]['task_id']}: "
                 f"{rows[0]['error'].removeprefix(task_error)}); fix the tasks' repo, patch or setup in their file, "
                 f"then {again}", 1)  # fmt: skip
        fail(f"no episode of {', '.join(unmeasured)} could run: nothing was measured for it; {again}", 1)
