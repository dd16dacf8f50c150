"""The benchmark report: per-model aggregates of the result rows, as data, Markdown and HTML.

Per model: success rate (over the episodes that ran: those that could not run, an endpoint down or
a setup failing, are counted apart as errors and say nothing of the model), mean adherence (over
solved tasks, where it counts), median turns,
mean tool calls and tool calls per turn, median completion tokens, median wall time, the
share of episodes with an unsupported claim, format errors, episodes stopped by the wall-clock
limit (failures: speed is part of the task; those that ran out waiting for the model, a slow
endpoint perhaps, shown in brackets), and generation speed in tokens per second of model time.
With several models the HTML adds a plot of success against median completion tokens (the
source system's "smart and fast" view).

Tokens here are reference tokens: every model's assistant turns counted with the one reference
tokenizer (`reference_tokens`, see runner.py), so models with different tokenizers compare, and
scripted policies, which report none, are counted too. Rows written before that count existed
are left out of the token columns. The policy's own counts (`completion_tokens`) feed the
efficiency reward, not this report.
"""

from __future__ import annotations

import html
import statistics
from typing import Any

from vivace.bench.baselines import OraclePolicy
from vivace.harness.policies import NullPolicy
from vivace.tasks.format import Task

ORACLE, NULL = OraclePolicy.name, NullPolicy.name


def task_problems(rows: list[dict[str, Any]], tasks: list[Task]) -> dict[str, str]:
    """Task id -> why the task is unsound here, judged by the scripted baselines' rows: the
    reference fix (`scripted:oracle`) must pass the hidden tests, doing nothing (`scripted:null`)
    must leave every FAIL_TO_PASS test failing, and neither episode may fail outright (a setup
    that does not run, say). A task neither ran on is not judged. Why it matters: no policy can
    solve a task its own fix does not, and a task solved by doing nothing rewards nothing in
    particular. `tasks` (those run) give the time limit tests ran out of."""
    test_timeouts = {t.id: t.tests.timeout_s for t in tasks}
    problems: dict[str, str] = {}
    for r in rows:
        d, task_id = r.get("details", {}), r["task_id"]
        if r["model"] not in (ORACLE, NULL) or task_id in problems:
            continue
        if r.get("error"):
            problems[task_id] = f"the {r['model']} episode failed: {r['error']}"
        elif r["model"] == ORACLE and not r.get("resolved"):
            why = why_unresolved(d, test_timeouts.get(task_id))
            problems[task_id] = (f"the reference_patch does not apply here ({why})" if d.get("first_rejected_edit")
                                 else f"the reference fix does not pass the tests ({why})")  # fmt: skip
        elif r["model"] == NULL and (d.get("fail_to_pass") or [0])[0] > 0:
            problems[task_id] = f"{_count(d['fail_to_pass'])} FAIL_TO_PASS tests pass without any change"
    return problems


def why_unresolved(details: dict[str, Any], limit: float | None = None) -> str:
    """Why an episode did not resolve its task, from its score's details: the first edit the tools refused,
    why the tests did not run, or the counts with the ids pytest never reported, or the time limit
    (`limit`, the task's tests.timeout_s) they ran out of. The counts alone would read as a wrong fix."""
    d = details
    if d.get("first_rejected_edit"):
        return d["first_rejected_edit"]
    if d.get("tests_timed_out"):  # the limit is the task's to raise
        return f"they timed out after {limit:g} s, the task's tests.timeout_s" if limit else "they timed out"
    why = d.get("tests_not_run") or (
        f"FAIL_TO_PASS {_count(d.get('fail_to_pass'))}, PASS_TO_PASS {_count(d.get('pass_to_pass'))} passed"
    )
    if missing := d.get("ids_without_outcome"):
        why += f"; pytest reported nothing for {', '.join(missing)}: check those ids"
    return why


def unsound_advice(rows: list[dict[str, Any]], problems: dict[str, str]) -> str:
    """What to do about the tasks in `problems`: a hand-written task is fixed in its file and checked by
    running the baselines again; one made by `vivace tasks swebench` is made again with its --check."""
    from_swebench = {r["task_id"]: r.get("kind") == "swebench" for r in rows if r["task_id"] in problems}
    advice = []
    if any("No module named pytest" in why for why in problems.values()):  # every task fails alike: the environment
        advice.append("the sandbox's Python has no pytest: install it where the tests run (vivace's own environment "
                      "unless sandbox.toolchain names another), e.g. `pip install pytest`")  # fmt: skip
    if not all(from_swebench.values()):
        advice.append("fix a task's tests, setup, env or reference_patch in its file, then check it with "
                      "`vivace bench --model scripted:oracle --model scripted:null --tasks FILE`")  # fmt: skip
    if any(from_swebench.values()):
        advice.append("for a SWE-bench task, run `vivace tasks swebench` again with the right --test-command, "
                      "--setup or --env, and --check")  # fmt: skip
    return "; ".join(advice)


def _count(pair: list[int] | None) -> str:
    return f"{pair[0]}/{pair[1]}" if pair else "?"


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    return {model: _summary(rs) for model, rs in by_model.items()}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in rows if "error" not in r]
    solved = [r for r in scored if r["resolved"]]
    d = [r["details"] for r in scored]
    counted = [x for x in d if x.get("reference_tokens") is not None]
    model_s = sum(x["model_s"] for x in counted)
    tokens = sum(x["reference_tokens"] for x in counted)
    # Speed only means something for a policy that generates: scripted ones report no tokens.
    generates = any(x.get("completion_tokens") for x in counted)
    return {
        "episodes": len(rows),
        "errors": len(rows) - len(scored),
        "success": len(solved) / len(scored) if scored else None,
        "mean_total": _mean([r["total"] for r in scored]),
        "adherence_solved": _mean([r["adherence"] for r in solved]),
        "median_turns": _median([x["turns"] for x in d]),
        "mean_tool_calls": _mean([x["tool_calls"] for x in d]),
        "tool_calls_per_turn": _mean([x["tool_calls_per_turn"] for x in d]),
        "median_ref_tokens": _median([x["reference_tokens"] for x in counted]),
        "median_wall_s": _median([x["wall_s"] for x in d]),
        "unsupported_claim_rate": _mean([1.0 if x["unsupported_claims"] else 0.0 for x in d]),
        "format_errors": sum(x["format_errors"] for x in d),
        # Episodes the policy ended by failing (a bug, a request its server refused), scored as failures: a
        # success rate of 0 from a policy that never ran must not read as a weak model.
        "policy_errors": sum(x.get("stop_reason") == "error" for x in d),
        # Scored as failures (the limit is part of the task: speed is measured), shown apart so a
        # slow endpoint is not mistaken for a weak model.
        "timeouts": sum(x.get("stop_reason") == "timeout" for x in d),
        "timeouts_waiting": sum(bool(x.get("timed_out_waiting")) for x in d),
        "ref_tokens_per_s": tokens / model_s if tokens and model_s and generates else None,
        "success_by_family": _by_family(rows),
    }


def _by_family(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """family -> [solved, episodes that ran], for tasks that name a family (the generated task families).
    The row holds the task's raw metadata value, which may be any JSON (a dict is unhashable): it is
    named as `Task.family` names it, with str()."""
    out: dict[str, list[int]] = {}
    for r in rows:
        if r.get("family"):
            counts = out.setdefault(str(r["family"]), [0, 0])
            counts[0] += bool(r.get("resolved"))
            counts[1] += "error" not in r
    return dict(sorted(out.items()))


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


_COLUMNS = [
    ("errors", "errors", "{:d}"),
    ("success", "success", "{:.1%}"),
    ("adherence_solved", "adherence (solved)", "{:.3f}"),
    ("median_turns", "median turns", "{:g}"),
    ("mean_tool_calls", "tool calls", "{:.1f}"),
    ("tool_calls_per_turn", "calls/turn", "{:.2f}"),
    ("median_ref_tokens", "median tokens (ref.)", "{:g}"),
    ("median_wall_s", "median wall s", "{:.1f}"),
    ("unsupported_claim_rate", "unsupported claims", "{:.1%}"),
    ("format_errors", "format errors", "{:d}"),
    ("policy_errors", "policy errors", "{:d}"),
    ("timeouts", "timeouts (waiting for the model)", "{}"),
    ("ref_tokens_per_s", "tokens/s (ref.)", "{:.0f}"),
]


def _shown(summary: dict[str, Any], key: str) -> Any:
    if key == "timeouts":  # "3 (2)": 3 stopped by the wall clock, 2 of them waiting for the model
        return f"{summary['timeouts']} ({summary['timeouts_waiting']})"
    return summary[key]


def _cell(value: Any, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def markdown(summary: dict[str, dict[str, Any]], title: str, unsound: dict[str, str] | None = None,
             advice: str = "") -> str:  # fmt: skip
    """The report; `unsound` (task_problems) and its `advice` (unsound_advice) add a section listing them."""
    head = "| model | episodes | " + " | ".join(c[1] for c in _COLUMNS) + " |"
    lines = [f"# {title}", "", head, "|" + "---|" * (len(_COLUMNS) + 2)]
    for model, s in summary.items():
        cells = [_cell(_shown(s, k), f) for k, _, f in _COLUMNS]
        lines.append(f"| {model} | {s['episodes']} | " + " | ".join(cells) + " |")
    if by_family := _family_rows(summary):
        lines += ["", "Success by task family (solved/episodes):", "",
                  "| family | " + " | ".join(summary) + " |", "|" + "---|" * (len(summary) + 1)]  # fmt: skip
        lines += [f"| {fam} | " + " | ".join(cells) + " |" for fam, cells in by_family]
    if unsound:
        lines += ["", "## Unsound tasks", "", f"{_UNSOUND} {advice}.", ""]
        lines += [f"- {task_id}: {' '.join(why.split())}" for task_id, why in unsound.items()]  # one line each
    return "\n".join(lines) + "\n"


_UNSOUND = "The scripted baselines show that these tasks measure nothing in this environment;"


def _family_rows(summary: dict[str, dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """(family, each model's solved/episodes) for every task family in the summary."""
    families = sorted({f for s in summary.values() for f in s.get("success_by_family", {})})
    return [(fam, [_solved(s.get("success_by_family", {}).get(fam)) for s in summary.values()]) for fam in families]


def _solved(counts: list[int] | None) -> str:
    return "n/a" if not counts or not counts[1] else f"{counts[0] / counts[1]:.0%} ({counts[0]}/{counts[1]})"


def html_report(summary: dict[str, dict[str, Any]], title: str, unsound: dict[str, str] | None = None,
                advice: str = "") -> str:  # fmt: skip
    """The report as one HTML page: what `markdown` says, and success against tokens plotted."""
    e = html.escape
    rows = "".join(
        "<tr><td>" + e(m) + f"</td><td>{s['episodes']}</td>"
        + "".join(f"<td>{_cell(_shown(s, k), f)}</td>" for k, _, f in _COLUMNS) + "</tr>"
        for m, s in summary.items()
    )  # fmt: skip
    head = "".join(f"<th>{e(c[1])}</th>" for c in _COLUMNS)
    plot = _plot(summary) if len(summary) > 1 else ""
    families = ""
    if by_family := _family_rows(summary):
        families = (
            "<h2>Success by task family (solved/episodes)</h2><table><tr><th>family</th>"
            + "".join(f"<th>{e(m)}</th>" for m in summary)
            + "</tr>"
            + "".join(
                f"<tr><td>{e(fam)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>" for fam, cells in by_family
            )
            + "</table>"
        )
    listed = ""
    if unsound:
        items = "".join(f"<li><b>{e(task_id)}</b>: {e(' '.join(why.split()))}</li>" for task_id, why in unsound.items())
        listed = f"<h2>Unsound tasks</h2><p>{e(f'{_UNSOUND} {advice}.')}</p><ul>{items}</ul>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
        f"</style></head><body><h1>{e(title)}</h1><table><tr><th>model</th><th>episodes</th>{head}</tr>"
        f"{rows}</table>{families}{plot}{listed}</body></html>\n"
    )


def _plot(summary: dict[str, dict[str, Any]]) -> str:
    """Success vs median completion tokens (reference tokenizer), as inline SVG."""
    pts = [(m, s["median_ref_tokens"] or 0, s["success"] or 0.0) for m, s in summary.items()]
    max_x = max(x for _, x, _ in pts) or 1
    w, h, pad = 480, 300, 50

    def sx(x: float) -> float:
        return pad + (w - 2 * pad) * x / max_x

    def sy(y: float) -> float:
        return h - pad - (h - 2 * pad) * y

    marks = "".join(
        f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='5' fill='#3366cc'/>"
        f"<text x='{sx(x) + 8:.1f}' y='{sy(y) - 6:.1f}' font-size='12'>{html.escape(m)}</text>"
        for m, x, y in pts
    )
    axes = (
        f"<line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#000'/>"
        f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{h - pad}' stroke='#000'/>"
        f"<text x='{w / 2}' y='{h - 12}' font-size='12' text-anchor='middle'>median completion tokens, reference tokenizer (max {max_x:g})</text>"
        f"<text x='14' y='{h / 2}' font-size='12' transform='rotate(-90 14 {h / 2})' text-anchor='middle'>success</text>"
    )
    return f"<h2>Success vs tokens</h2><svg width='{w}' height='{h}' xmlns='http://www.w3.org/2000/svg'>{axes}{marks}</svg>"
