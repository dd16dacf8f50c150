"""Name-swapped, cut-short expert episodes: dense practice at the decisions that need copying.

Why: a small policy trained on whole expert episodes learns the tool-call format and the expert's
plan long before it learns to copy a name it has never seen. Measured on the tiny model after 35
minutes of CPU training on 4,200 episodes: 89% of assistant tokens right under teacher forcing,
but 0 of 165 first tokens of a `path` argument and 1 of 69 of an `old_string` — it wrote package
names it remembered (`gru/core.py`) instead of the one in the traceback (`museum/core.py`).
Copying has to be practised where it is needed, many times, with names that cannot be remembered.

What: `augment_episodes` turns each expert episode (the JSONL `vivace sft data` writes, with its
OpenAI-style `messages`) into `variants` new ones: the project's package name is replaced in every
message after the system prompt (request, tool results, the expert's calls and answer) by a fresh
name — an invented word or a Python identifier from the standard library, never a word of a
validation or test theme — and the dialogue is cut after the turn that first names a file of the
package (the traceback-to-path decision) or after the first edit (path and old_string copied from
the request and the file). Each variant is rendered by `harness.policy.render_conversation`:
exactly the tokens the harness gives a model in that conversation, loss mask on assistant tokens.
The system turn is shared by all, so a training row computes it once (rl/packing.py) and a cut
episode costs only its own few hundred tokens.

Options measured in attempt 6 (docs/benchmarks.md): `theme_names` renames the record nouns and
fields too (hence function names built from them), `cuts` adds "whole" (uncut) and "retry" (a
near-miss read and its error before the right call), `train_context` trains every token after
the system turn. Not covered: renaming names that are not the theme's (`total`, `bound`), and
checking the renamed code still runs (nothing executes it; the tool results are edited text).
"""

from __future__ import annotations

import json
import keyword
import random
import re
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from vivace.harness.messages import Message, ToolCall, messages_from_openai
from vivace.harness.policy import render_conversation
from vivace.harness.tools.base import ToolResult
from vivace.rl.packing import common_prefix
from vivace.tasks.projects import THEMES, _invent, _theme_words, split_of_theme, theme_spec

CUTS = ("first_file", "first_edit")  # and "whole" (uncut), "retry" (with_failed_read), "retry_edit" (with_failed_edit)


def held_out_words() -> set[str]:
    """Words of the validation and test themes (package, record nouns, fields, record names)."""
    return {w for t, spec in THEMES.items() if split_of_theme(t) != "train" for w in (*_theme_words(spec), *spec[5])}


def name_pool(limit: int = 20_000) -> list[str]:
    """Lower-case identifiers of 3-12 letters from the standard library's source (real words and
    programmers' names, offline), minus held-out theme words; sorted, so the pool is reproducible."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    words: set[str] = set()
    for path in sorted(stdlib.glob("*.py")):
        try:
            words.update(re.findall(r"\b[a-z]{3,12}\b", path.read_text(errors="ignore")))
        except OSError:
            continue
        if len(words) >= limit:
            break
    return sorted(words - held_out_words() - set(keyword.kwlist) - {"tests", "test", "core", "util", "report"})


def read_expert_rows(path: Path) -> list[dict[str, Any]]:
    """The episodes of a `vivace sft data` file, each line checked to be an object whose "messages"
    are well-formed chat messages; anything else is an SftDataError naming the file and line."""
    from vivace.rl.sft_train import SftDataError, jsonl_objects

    rows = []
    for where, row in jsonl_objects(path):
        if "messages" not in row:
            keys = ", ".join(sorted(row)[:4]) or "none"
            raise SftDataError(f'{where}: no "messages" (keys: {keys}); augment reads the expert episodes that '
                               "`vivace sft data` writes, not rendered training rows")  # fmt: skip
        if not isinstance(row.get("task_id"), str | None):
            raise SftDataError(f'{where}: "task_id" must be a string (the task the episode solves) or null, '
                               f"got {type(row['task_id']).__name__}")  # fmt: skip
        try:
            check_characters(messages_from_openai(row["messages"], where=f"{where}: messages"), f"{where}: messages")
        except ValueError as e:
            raise SftDataError(str(e)) from None
        rows.append(row)
    if not rows:
        raise SftDataError(f"{path}: no episodes (the file is empty)")
    return rows


def check_characters(messages: list[Message], where: str = "messages") -> None:
    """A ValueError naming the first field that holds a lone surrogate (JSON's "\\ud800" outside a
    pair). `messages_from_openai` keeps them (the server refuses them itself), but no UTF-8 spells
    one, so the tokenizer would fail on it halfway through the run instead of naming the line."""
    for i, m in enumerate(messages):
        fields = {"content": m.content, "name": m.name, "tool_call_id": m.tool_call_id}
        for j, c in enumerate(m.tool_calls):
            at = f"tool_calls[{j}]"
            fields |= {f"{at}.id": c.id, f"{at}.function.name": c.name, f"{at}.function.arguments": c.arguments}
        for field, value in fields.items():
            try:
                json.dumps(value, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                raise ValueError(f"{where}[{i}].{field} holds a lone surrogate (a \\ud800-\\udfff escape outside "
                                 "a pair), which is no character and cannot be tokenized; remove it from the line"
                                 ) from None  # fmt: skip


def check_package_names(names: Iterable[str]) -> None:
    """A ValueError for the first of `names` (`--package`) that cannot name a Python package: the
    name goes into every path (`NAME/core.py`) and import of the renamed episode, so an empty name
    wrote `/core.py`, and `a-b`, `a.b` or `1x` wrote code that cannot import."""
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"--package {name!r} is not a Python package name; give an identifier "
                             "(letters, digits and _, not starting with a digit, not a keyword), e.g. lighthouse")  # fmt: skip


def package_of(messages: list[dict[str, Any]]) -> str | None:
    """The package the expert works in: the first directory of the first non-test path it passes."""
    for m in messages:
        for c in m.get("tool_calls") or ():
            args = c.get("function", c).get("arguments", {})
            try:
                args = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                continue
            if not isinstance(args, dict):
                continue
            for key in ("path", "paths"):
                for p in [args.get(key)] if isinstance(args.get(key), str) else args.get(key) or []:
                    if isinstance(p, str) and "/" in p and not p.startswith("tests"):
                        return p.split("/", 1)[0]
    return None


def theme_of(task_id: str | None) -> str | None:
    """The theme a generated task's id starts with ("gen-97669-misspelled-name-…" → "gen-97669")."""
    if not task_id:
        return None
    parts = task_id.split("-")
    theme = "-".join(parts[:2]) if parts[0] == "gen" else parts[0]
    return theme if theme.startswith("gen-") or theme in THEMES else None


# English letter frequencies (per mille, a-z): random names in the shapes real text tokenizes into.
_LETTER_WEIGHTS = (82, 15, 28, 43, 127, 22, 20, 61, 70, 2, 8, 40, 24, 67, 75, 19, 1, 60, 63, 91, 28, 10, 24, 2, 20, 1)


def random_letters(rng: random.Random) -> str:
    """A name of 4-10 letters drawn one by one with their English frequencies ("tnoedh", "awrsileu"):
    no pattern a model could learn to predict, so the only way to write it again is to copy it. The
    invented words of `_invent` follow a syllable pattern, and a policy trained on them continues a
    held-out name's first piece with invented syllables (`kit` → `kitingen` for `kitchen`)."""
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", _LETTER_WEIGHTS, k=rng.randint(4, 10)))


def fresh_word(rng: random.Random, letters_share: float = 0.0) -> str:
    """An invented word (`_invent`), or random letters with probability `letters_share`."""
    return random_letters(rng) if letters_share and rng.random() < letters_share else _invent(rng)


def theme_renames(
    theme: str,
    messages: list[Message],
    rng: random.Random,
    pool: list[str] | None = None,
    invented_share: float = 0.5,
    letters_share: float = 0.0,
) -> dict[str, str]:
    """Fresh invented words for the theme's package, record nouns and numeric fields; the package is
    a word of `pool` instead with probability 1 - `invented_share` (held-out packages are real words
    like `museum`). Each invented word is random letters instead with probability `letters_share`.
    A word the expert's fix writes (in an edit's new_string but not its old_string: the typo's
    correct form) keeps its name, since its misspelt form in the code is not renamed with it."""
    pkg, item, items, (field, other), *_ = theme_spec(theme)
    fixed = set()
    for m in messages:
        for c in m.tool_calls:
            if c.name == "edit_file" and isinstance(c.arguments, dict):
                old, new = str(c.arguments.get("old_string", "")), str(c.arguments.get("new_string", ""))
                fixed |= {
                    w for w in (pkg, item, items, field, other) if _word(w).search(new) and not _word(w).search(old)
                }
    held_out = held_out_words()
    fresh = iter(w for w in iter(lambda: fresh_word(rng, letters_share), None) if w not in held_out)
    new_item = next(fresh)
    package = rng.choice(pool) if pool and rng.random() >= invented_share else next(fresh)
    mapping = {pkg: package, item: new_item, items: new_item + "s", field: next(fresh), other: next(fresh)}
    return {old: new for old, new in mapping.items() if old not in fixed}


def _word(w: str) -> re.Pattern:
    """`w` not inside a longer word: underscores and digits count as edges (`count_books_over`)."""
    return re.compile(rf"(?<![A-Za-z]){re.escape(w)}(?![a-z])")


def rename(messages: list[Message], old: str, new: str) -> list[Message]:
    """Every `old` (as a word or a part of an identifier) replaced by `new` after the system prompt."""
    return rename_words(messages, {old: new})


def rename_words(messages: list[Message], mapping: dict[str, str]) -> list[Message]:
    """Each key of `mapping`, as a word or a part of an identifier (capitalised too), replaced by its
    value after the system prompt (content and tool-call arguments); longer words first."""
    table = {**mapping, **{k.capitalize(): v.capitalize() for k, v in mapping.items()}}
    words = sorted(table, key=len, reverse=True)
    pattern = re.compile(rf"(?<![A-Za-z])(?:{'|'.join(map(re.escape, words))})(?![a-z])") if words else None

    def sub(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda m: table[m.group(0)], value) if pattern else value
        if isinstance(value, dict):
            return {k: sub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [sub(v) for v in value]
        return value

    out = []
    for m in messages:
        if m.role == "system":
            out.append(m)
            continue
        calls = tuple(ToolCall(c.id, c.name, sub(c.arguments), c.error) for c in m.tool_calls)
        out.append(Message(m.role, sub(m.content), calls, m.tool_call_id, m.name))
    return out


def cut_after(messages: list[Message], cut: str, package: str) -> list[Message] | None:
    """The messages up to and including the assistant turn that first names a file of `package`
    (first_file) or first calls edit_file (first_edit), all of them for "whole"; None when no turn does."""
    if cut == "whole":
        return messages
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        if cut == "first_edit" and any(c.name == "edit_file" for c in m.tool_calls):
            return messages[: i + 1]
        if cut == "first_file" and any(f"{package}/" in json.dumps(c.arguments) for c in m.tool_calls):
            return messages[: i + 1]
    return None


def with_failed_read(messages: list[Message], package: str, rng: random.Random) -> tuple[list[Message], int] | None:
    """The messages up to the first assistant turn naming a file of `package`, with a failed read
    inserted before it: a read_file of a wrong path (the package cut short by 1-3 letters, a letter
    changed, or a short other name) and the error the tool gives for it, hint included. Returns
    (messages, index of the inserted, untrained turn); None when no turn names a package file.
    What the expert never shows otherwise: after "does not exist", copy the path again from the
    context instead of repeating the call."""
    from vivace.harness.tools.files import missing_file

    kept = cut_after(messages, "first_file", package)
    if kept is None or len(package) < 3:
        return None
    path = next(
        (a.get(k) for c in kept[-1].tool_calls if isinstance(a := c.arguments, dict) for k in ("path", "paths")
         if isinstance(a.get(k), str) and a[k].startswith(f"{package}/")),
        f"{package}/core.py",
    )  # fmt: skip
    draw = rng.random()
    if draw < 0.3:  # a whole other name, as a policy that recalls a training package writes
        wrong = next(w for w in iter(lambda: _invent(rng)[: rng.randint(2, 5)], None) if w != package)
    elif draw < 0.65:
        wrong = package[: -rng.randint(1, min(3, len(package) - 2))]
    else:
        i = rng.randrange(1, len(package))
        wrong = package[:i] + rng.choice([c for c in "aeioulnrst" if c != package[i]]) + package[i + 1 :]
    bad = path.replace(f"{package}/", f"{wrong}/", 1)
    text = missing_file(bad, sorted(paths_named(messages))).text
    call = Message("assistant", kept[-1].content, (ToolCall("call_0", "read_file", {"path": bad}),))
    failed = Message("tool", text, tool_call_id="call_0", name="read_file")
    return [*kept[:-1], call, failed, kept[-1]], len(kept) - 1


def paths_named(messages: list[Message]) -> set[str]:
    """The project's files an episode shows: every `dir/…/name.ext` in its request, tool results and
    calls (the files a suggestion can name; the real tool lists the workspace, which for these
    generated projects holds the same package and test files)."""
    found: set[str] = set()
    for m in messages[1:]:
        found |= set(_PATH.findall(m.content or ""))
        for c in m.tool_calls:
            found |= set(_PATH.findall(json.dumps(c.arguments)))
    return found


_PATH = re.compile(r"(?<![\w./])(?:[A-Za-z_][\w]*/)+[A-Za-z_][\w]*\.(?:py|toml|txt|md|json)\b")


def with_failed_edit(messages: list[Message], rng: random.Random) -> tuple[list[Message], int] | None:
    """The messages up to the first edit_file turn, with a failed edit inserted before it: the same
    call with a near-miss old_string (a letter dropped, doubled or changed) and the error the tool
    gives, which shows the closest line of the file (read back from the episode's read_file result).
    Returns (messages, index of the inserted, untrained turn); None when the episode has no edit, or
    no read of the edited file before it, or the near miss happens to occur in the file."""
    from vivace.bench.baselines import files_read
    from vivace.harness.tools.files import replace_text

    kept = next((messages[: i + 1] for i, m in enumerate(messages) if m.role == "assistant" and any(
        c.name == "edit_file" for c in m.tool_calls)), None)  # fmt: skip
    if kept is None:
        return None
    call = next(c for c in kept[-1].tool_calls if c.name == "edit_file")
    args = call.arguments if isinstance(call.arguments, dict) else {}
    path, old = args.get("path"), args.get("old_string")
    text = files_read(kept).get(path) if isinstance(path, str) else None
    if text is None or not isinstance(old, str) or len(old.strip()) < 2:
        return None
    bad = near_miss(old, rng)
    result = replace_text(text, bad, str(args.get("new_string", "")), False, path)
    if not isinstance(result, ToolResult) or not result.is_error:
        return None  # the near miss matched something: not a failed edit
    wrong = Message("assistant", kept[-1].content, (ToolCall("call_0", "edit_file", {**args, "old_string": bad}),))
    failed = Message("tool", result.text, tool_call_id="call_0", name="edit_file")
    return [*kept[:-1], wrong, failed, kept[-1]], len(kept) - 1


def near_miss(s: str, rng: random.Random) -> str:
    """`s` with one letter dropped, doubled or changed (a typo of the kind a copy gets wrong)."""
    letters = [i for i, ch in enumerate(s) if ch.isalnum()]
    if not letters:
        return s + s[-1]
    i = rng.choice(letters)
    how = rng.choice(("drop", "double", "change"))
    if how == "drop" and len(s) > 2:
        return s[:i] + s[i + 1 :]
    if how == "double":
        return s[:i] + s[i] + s[i:]
    return s[:i] + rng.choice([c for c in "aeioulnrst" if c != s[i]]) + s[i + 1 :]


def augment_episodes(
    rows: Iterator[dict[str, Any]],
    chat: Any,
    tools: list[dict],
    variants: int = 4,
    seed: int = 0,
    invented_share: float = 0.5,
    progress: Callable[[int], None] = lambda done: None,
    cuts: tuple[str, ...] = CUTS,
    theme_names: bool = False,
    train_context: bool = False,
    letters_share: float = 0.0,
    packages: list[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """`variants` renamed, cut-short copies of each expert episode row, as {"task_id", "cut",
    "package", "ids", "loss_mask"} rows. Rows without messages or without a package are skipped.
    `theme_names`: the theme's record nouns and fields get fresh invented names too (rows of other
    tasks keep the package-only rename). `train_context`: the loss mask covers every token after
    the system turn (the request and tool results too), not only the assistant's: a language-model
    objective in which a fresh name's every later mention is a copy of an earlier one.
    `letters_share`: the share of invented names that are random letters (`random_letters`).
    `packages`: the package's new name is one of these words (e.g. a probe of how well a model copies
    names of a kind it never trained on); the other renamed words are drawn as usual."""
    check_package_names(packages or ())
    rng = random.Random(seed)
    pool = name_pool()
    for n, row in enumerate(rows, 1):
        progress(n)
        old = package_of(row.get("messages") or [])
        if old is None:
            continue
        messages = messages_from_openai(row["messages"])  # as checked: content parts joined, developer as system
        theme = theme_of(row.get("task_id")) if theme_names else None
        for _ in range(variants):
            if theme is not None:
                mapping = theme_renames(theme, messages, rng, pool, invented_share, letters_share)
            else:
                mapping = {old: fresh_word(rng, letters_share) if rng.random() < invented_share else rng.choice(pool)}
            if packages and old in mapping:  # (not when the fix writes the package's name)
                mapping[old] = rng.choice(packages)
            new = mapping.get(old, old)
            cut = rng.choice(cuts)
            renamed, untrained = rename_words(messages, mapping), None
            if cut in ("retry", "retry_edit"):
                found = with_failed_read(renamed, new, rng) if cut == "retry" else with_failed_edit(renamed, rng)
                kept, untrained = found if found else (None, None)
            else:
                kept = cut_after(renamed, cut, new)
            if kept is None:
                continue
            ids, mask = render_conversation(chat, kept, tools)
            if untrained is not None:  # the near-miss call is context, never a target
                end, n = (
                    len(render_conversation(chat, kept[: untrained + 1], tools)[0]),
                    len(chat.assistant_ids(kept[untrained])),
                )
                mask[end - n : end] = [0] * n
            if train_context:
                system = common_prefix([ids, chat.prompt_ids(kept[:1], tools)]) if kept[0].role == "system" else 0
                mask = [0] * system + [1] * (len(ids) - system)
            yield {"task_id": row.get("task_id"), "cut": cut, "package": new, "ids": ids, "loss_mask": mask}
