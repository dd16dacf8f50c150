"""Synthetic copying sequences: the first stage of the tiny policy's warm start.

Why: an agent copies all the time — a path from a traceback into read_file, a misspelled name
into old_string — and a small model trained from scratch on agent episodes learns the format long
before it learns to copy (measured on the tiny preset: after 35 minutes on 4,200 expert episodes,
0 of 165 path arguments right under teacher forcing). Copying needs *induction heads* (attend to
where the current token occurred before, predict what followed it), and those form abruptly after a
plateau whose length depends on the data. On random tokens repeated several times per sequence the
tiny model's plateau ends after ~450 steps of 32 sequences (lr 1e-3, ~4 minutes on 2 CPU cores),
after which it copies 97% of repeated tokens; on agent episodes alone it had not ended after 275
steps of 16k tokens. So the warm start begins here, then moves to the episodes.

What: `copy_sequences` yields {"ids", "loss_mask"} rows `vivace sft train` reads: a random span of
`span` tokens (ids drawn uniformly from `vocab`), then `repeats` times a short random filler and the
span again; the loss is on the repeated spans (all but their first token, which nothing predicts).
`lookback_sequences` copies spans from anywhere in a long random context (copies from far back).
`path_drills` is the other kind of practice: windows of expert episodes ending at a tool-call
argument (path, old_string, new_string). A narrow vocabulary makes the plateau short; a second
pass over the whole vocabulary lets the copying work for any token. Not covered (measured in
docs/benchmarks.md, warm start attempt 5): copy heads trained on these rows alone copy nothing
behind the 2,700-token system turn, and none of them has yet carried over to copying names out
of an episode's tracebacks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any


def copy_sequences(
    n: int,
    vocab: tuple[int, int],
    seed: int = 0,
    span: tuple[int, int] = (8, 24),
    repeats: int = 3,
    filler: tuple[int, int] = (0, 8),
) -> Iterator[dict[str, list[int]]]:
    """`n` rows of a random span copied `repeats` times after short fillers; ids in [vocab[0], vocab[1])."""
    lo, hi = vocab
    if not 0 <= lo < hi:
        raise ValueError(f"vocab must be a range [lo, hi) of token ids, got {vocab}")
    rng = random.Random(seed)

    def tokens(k: int) -> list[int]:
        return [rng.randrange(lo, hi) for _ in range(k)]

    for _ in range(n):
        chunk = tokens(rng.randint(*span))
        ids = tokens(rng.randint(*filler)) + chunk
        mask = [0] * len(ids)
        for _ in range(repeats):
            gap = tokens(rng.randint(*filler))
            ids += gap + chunk
            mask += [0] * (len(gap) + 1) + [1] * (len(chunk) - 1)
        yield {"ids": ids, "loss_mask": mask}


LOOKBACK_SPAN = (8, 24)  # tokens per copied span, lo and hi: what a path or an old_string fragment takes


def lookback_sequences(
    n: int,
    vocab: tuple[int, int],
    seed: int = 0,
    context: int = 1024,
    span: tuple[int, int] = LOOKBACK_SPAN,
    pool: Sequence[int] | None = None,
) -> Iterator[dict[str, list[int]]]:
    """`n` rows of `context` random tokens followed by as many tokens of spans copied from random
    places in it; the loss is on the copies (all but each span's first token). `pool`: draw the
    tokens from these ids instead of the range `vocab` (see `name_pieces`).

    Why beside `copy_sequences`: there each copy sits a few tokens after its source, and the heads
    that form there copy only nearby tokens (measured: a checkpoint copying 84% at gaps of 0-8 tokens
    copied 0% at gaps of 64-1,024), while a path or a misspelled name sits hundreds of tokens back
    in a traceback or a file. Here every source is 1 to 2x`context` tokens back and about half the
    row is trained, so the signal per step stays dense (a long random filler between copies
    trains a handful of tokens per row)."""
    lo, hi = vocab
    if pool is None and not 0 <= lo < hi:
        raise ValueError(f"vocab must be a range [lo, hi) of token ids, got {vocab}")
    if pool is not None and not pool:
        raise ValueError("the token pool is empty")
    if context < span[1]:
        raise ValueError(f"context ({context}) must hold the longest span ({span[1]})")
    rng = random.Random(seed)
    draw = (lambda: rng.choice(pool)) if pool is not None else (lambda: rng.randrange(lo, hi))
    for _ in range(n):
        ids = [draw() for _ in range(context)]
        mask = [0] * context
        while len(ids) < 2 * context:
            k = rng.randint(*span)
            at = rng.randrange(0, context - k + 1)
            ids += ids[at : at + k]
            mask += [0] + [1] * (k - 1)
        yield {"ids": ids, "loss_mask": mask}


def name_pieces(model: str = "tiny", words: int = 5000, seed: int = 0) -> list[int]:
    """The token ids invented names break into (`museum` → `m`, `use`, `um`), each as often as it
    occurs in `words` of them: a pool to draw from with a name's frequencies.

    Why: copy heads trained on ids drawn from thousands match a single token, which is unique in its
    context; a name's pieces are a few hundred short, common tokens that recur all over an episode,
    so copying one needs a match on the tokens before it. Lookback rows over this pool ask for that."""
    from collections import Counter

    from vivace.model.checkpoint import load_tokenizer
    from vivace.tasks.projects import _invent

    tokenizer = load_tokenizer(model)
    rng = random.Random(seed)
    counts: Counter[int] = Counter()
    for _ in range(words):
        counts.update(tokenizer.encode(_invent(rng), add_special_tokens=False))
    return sorted(counts.elements())


def system_opening(model: str = "tiny") -> list[int]:
    """The token ids every agent episode opens with: the harness's system turn (prompt and tool
    schemas, rendered by the chat format) and the start of the user turn. Copy rows behind it are
    practised at the positions, and against the ~2,700 keys, that an episode's copies meet."""
    from vivace.harness.chat import ChatFormat
    from vivace.harness.messages import Message
    from vivace.harness.prompts import SYSTEM_PROMPT
    from vivace.harness.tools import default_tools
    from vivace.harness.tools.base import tool_schema
    from vivace.model.checkpoint import load_tokenizer

    chat = ChatFormat(load_tokenizer(model))
    tools = [tool_schema(t) for t in default_tools()]
    ids = chat.prompt_ids([Message("system", SYSTEM_PROMPT), Message("user", "")], tools)
    user = chat.encode("<|im_start|>user\n")
    at = next(i for i in range(len(ids)) if ids[i : i + len(user)] == user)
    return ids[: at + len(user)]


def path_drills(
    rows: Iterable[dict[str, Any]],
    decode: Callable[[list[int]], str],
    turn_start: int,
    window: int = 1024,
    seed: int = 0,
    arguments: tuple[str, ...] = ("path",),
) -> Iterator[dict[str, list[int]]]:
    """Retrieval drills cut from expert episodes: for every `path` argument the expert wrote (or
    any of `arguments`, e.g. `old_string`), the system turn, then up to `window` tokens before the
    value (the traceback or file it came from), then the value; the loss is on the value only.

    Why: the tokenizer splits names into short pieces (`museum` -> `m` `use` `um`), so the first
    piece of a path is not a copy of "what followed this token before" but a lookup of "which
    name starts the line the error came from" — a skill that drowns in whole episodes, where
    it is a handful of tokens among thousands (measured: 0 of 95 first path tokens right after
    an assistant stage whose other tokens were 88% right). `turn_start` is the id that opens a
    chat turn: the system turn is everything before the second one, kept so the drill is
    practised in the context the agent meets (a drill without it did not transfer)."""
    rng = random.Random(seed)
    for row in rows:
        ids = row["ids"]
        mask = row.get("loss_mask") or [1] * len(ids)  # no mask: every token trained, as in sft train
        starts = [i for i, t in enumerate(ids) if t == turn_start]
        if len(starts) < 2:
            continue
        system = starts[1]
        for _, s, e in argument_values(ids, mask, decode, arguments, start=system + 1):
            a = max(system, s - rng.randint(window // 2, window))
            yield {"ids": ids[:system] + ids[a : e + 1], "loss_mask": [0] * (system + s - a) + [1] * (e + 1 - s)}


def argument_values(
    ids: list[int],
    mask: list[int],
    decode: Callable[[list[int]], str],
    arguments: tuple[str, ...] = ("path",),
    start: int = 1,
) -> Iterator[tuple[str, int, int]]:
    """(argument name, first, last) token positions of every string value of `arguments` that the
    assistant wrote (loss_mask 1) in a tool call; `last` is the token holding the closing quote.
    A value whose closing quote is not in the same trained run (the turn ends first) is left out:
    cut short, a drill would train on part of it and the eval would score part of it as the whole.
    Linear in len(ids): values do not overlap, and an unclosed one leaves no key after it in its run."""
    keys = tuple(f'"{name}": "' for name in arguments)
    run_end = 0  # the end (exclusive) of the trained run holding s
    for s in range(max(start, 1), len(ids)):
        if not mask[s] or mask[s - 1] == 0:
            continue
        before = decode(ids[max(0, s - 6) : s])
        key = next((k for k in keys if before.endswith(k)), None)
        if key is None:
            continue
        run_end = max(run_end, s)
        while run_end < len(ids) and mask[run_end]:
            run_end += 1
        e = _closing_quote(ids, s, run_end, decode)
        if e is not None:
            yield key[1 : key.index('"', 1)], s, e


def _closing_quote(ids: list[int], s: int, end: int, decode: Callable[[list[int]], str]) -> int | None:
    """The position in [s, end) of the token holding the quote that closes a JSON string whose text
    starts at token `s` (a quote after an odd run of backslashes is escaped); None when none does.
    Token by token: a quote or backslash is one byte, never part of another character's bytes."""
    escaped = False
    for e in range(s, end):
        for ch in decode([ids[e]]):
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                return e
    return None
