"""Supervised warm start (`vivace sft train`): next-token cross-entropy on expert episodes.

What: `train_sft` reads the JSONL that `vivace sft data` writes (ids + loss_mask per line; a line
with only "ids" trains on every token, so a plain-text corpus can be a first stage), trains the
policy with AdamW and writes a standard checkpoint (`save_checkpoint`, fp32) with
`train_log.jsonl` (one line per step, eval lines) and `sft_summary.json` (arguments, data sha256,
counts, final numbers). The loss is the mean over tokens whose loss_mask is 1 — the target
token's mask, the same masking RL uses — plus the router's load-balancing loss (Qwen3-MoE's own
`aux_loss` at `config.router_aux_loss_coef`; a balanced router scores `num_experts_per_tok`).

Packing (rl/packing.py): episodes are packed several to a row of `seq_len` computed positions
(greedy best-fit decreasing, equal lengths in a seeded order, rows shuffled every epoch); the
opening all episodes share (the system turn) is computed once per row and every episode attends
to it and to itself only, with its own positions, so each episode's logits are exactly those of
the episode run alone. Rows are grouped into steps of about `batch_tokens` computed positions,
one row per forward, gradients accumulated and normalised by the step's trained tokens (so the
grouping does not change the update). No padding. Episodes longer than `seq_len` or the model's
context are skipped and counted.

Schedule: linear warmup (at most a quarter of the planned steps), then cosine to
`min_lr_ratio * lr`. Its progress is the larger of steps/planned steps (from `max_steps`, or
`epochs` times the first epoch's step count) and elapsed/`time_budget_s`, so a time budget alone
still decays to the floor as time runs out (that run then depends on the machine's speed; step
and epoch budgets are deterministic for a seed). The run stops at whichever budget comes first
(one epoch when none is given) or at Ctrl-C, and saves the checkpoint; it also saves every
`save_every` steps, so a killed run keeps its last save. Not covered: resuming (the optimizer
is not saved), several devices, several rows per forward.

Device: `device="auto"` trains on the GPU when torch sees one (fp32 weights and AdamW state, bf16
autocast for the forward; rows stay one per forward, so a step's batch is its rows accumulated;
use long rows there, e.g. `--seq-len 131072`: episodes keep their own positions, so a row may be
longer than the context), else on the CPU in fp32.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vivace.files import write_atomic
from vivace.rl.packing import IGNORE, PACKED, Episode, forward_row, make_episode, pack, pack_episodes, row_tokens
from vivace.signals import deferred_signals

__all__ = [
    "IGNORE",
    "PACKED",
    "SftDataError",
    "SftDiverged",
    "check_files",
    "evaluate_checkpoint",
    "forward_row",
    "make_episode",
    "pack",
    "read_episodes",
    "train_sft",
]
GRAD_CLIP = 1.0


class SftDataError(ValueError):
    """Training data that cannot be used; the message names the file and line and the fix."""


class SftDiverged(Exception):
    """The loss, the gradient or a weight became NaN or infinite: the run stops, and such weights are
    never saved (a save from before stays as it was)."""


OBJECTIVES = ("assistant", "dialogue", "paths")


# Message texts no template writes itself, to find each message's place in a rendering.
_PROBE = {"system": "vivace probe: system", "user": "vivace probe: user", "assistant": "vivace probe: assistant"}


def turn_start_token(chat) -> int | None:
    """The id of the control token that opens every message in `chat`'s format (a ChatFormat, the
    one `vivace sft data` renders episodes with), or None when there is none: <|im_start|> for a Qwen
    vocabulary. A vocabulary without it (Llama 3, Mistral) gets vivace's template with "<|im_start|>"
    spelled as several text tokens, which a message can hold too, so no id marks a turn's start."""
    from vivace.harness.messages import Message

    text = chat.render([Message(role, content) for role, content in _PROBE.items()])
    contents = [text.find(content) for content in _PROBE.values()]
    for token in sorted((t for t in chat.tokenizer.get_added_vocab() if t in text), key=text.find):
        at = [m.start() for m in re.finditer(re.escape(token), text)]
        # once per message, each before its text (a turn's end token comes after it)
        if (
            len(at) == len(contents)
            and all(c < a for c, a in zip(contents, at[1:], strict=False))
            and all(a < c for a, c in zip(at, contents, strict=True))
        ):
            return chat.tokenizer.convert_tokens_to_ids(token)
    return None


def require_turn_start(tokenizer, needs: str) -> int:
    """The turn-start id (turn_start_token) of `tokenizer`'s chat format; a ValueError when it has none,
    beginning with what `needs` it and why (without it the system turn cannot be told from the rest of
    an episode, and the dialogue objective quietly trained the assistant tokens only)."""
    from vivace.harness.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    turn_start = turn_start_token(chat)
    if turn_start is None:
        raise ValueError(f"{needs} needs a token that opens every chat turn, to find an episode's system turn, and "
                         f"{chat.template_name} has none in this tokenizer's vocabulary (such as Qwen's <|im_start|>)")  # fmt: skip
    return turn_start


def read_episodes(path: Path, vocab_size: int, turn_start: int | None = None) -> list[Episode]:
    """Every line of a JSONL file, checked: ids in the vocabulary, a 0/1 loss_mask per id.
    With `turn_start` (the chat format's message-start token) the "dialogue" objective: every
    token after the system turn (prompt + tool schemas, the same in every episode, kept as untrained
    context and computed once per row) is trained — tracebacks, file reads and edits repeat one
    another, so it is copying practice in the context the policy acts in."""
    episodes = []
    for where, row in jsonl_objects(path):
        ids = row.get("ids")
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise SftDataError(f'{where}: expected an object with "ids", a list of integer token ids')
        bad = next((i for i in ids if not 0 <= i < vocab_size), None)
        if bad is not None:
            raise SftDataError(f"{where}: token id {bad} is outside the vocabulary (0..{vocab_size - 1}); "
                               "render the data with this model's tokenizer (`vivace sft data --model`)")  # fmt: skip
        mask = row.get("loss_mask")
        if mask is None and "loss_mask" in row:  # a writer that lost its mask, more likely than a wish to train all
            raise SftDataError(f'{where}: "loss_mask" is null; give one 0/1 per id, or drop the key to train on '
                               "every token")  # fmt: skip
        if mask is not None and (not isinstance(mask, list) or len(mask) != len(ids)
                                 or any(type(m) is not int or m not in (0, 1) for m in mask)):  # fmt: skip
            got = f"{len(mask)} entries" if isinstance(mask, list) else type(mask).__name__
            raise SftDataError(f'{where}: "loss_mask" must be one integer 0 or 1 per id ({len(ids)} ids, got {got}'
                               f'{"" if got != f"{len(ids)} entries" else ", not all 0/1 integers"}); '
                               'fix the line or drop "loss_mask" to train on every token')  # fmt: skip
        if turn_start is not None:
            starts = [i for i, t in enumerate(ids) if t == turn_start][:2]
            if len(starts) < 2:
                raise SftDataError(f"{where}: the dialogue objective needs a chat episode (a system turn, then more)")
            mask = [0] * starts[1] + [1] * (len(ids) - starts[1])
        episodes.append(make_episode(ids, mask))
    if not episodes:
        raise SftDataError(f"{path}: no episodes (the file is empty)")
    return episodes


_LINES_SCANNED = 200  # how far into a data file check_rendered_with looks for agent episodes


def check_rendered_with(path: Path, tokenizer) -> None:
    """An SftDataError when `path`'s agent episodes were rendered with another tokenizer than `tokenizer`,
    though their ids all fit its vocabulary (`vivace sft data` with its default --model tiny, then `sft train
    --init` another checkpoint): the run would train on ids that spell other text. Every agent episode
    (a row with a task_id; synthetic copy drills are no text) opens with the chat format's system turn,
    whose opening this model's chat format makes of its own ids."""
    from vivace.harness.chat import ChatFormat
    from vivace.harness.messages import Message

    mark = _PROBE["system"]
    text = ChatFormat(tokenizer).render([Message("system", mark)])
    opening = tokenizer.encode(text[: text.index(mark)], add_special_tokens=False)[:-1]  # the last may merge on
    for n, (where, row) in enumerate(jsonl_objects(path)):
        if n >= _LINES_SCANNED:
            return
        ids = row.get("ids")
        if "task_id" in row and isinstance(ids, list) and opening:
            if ids[: len(opening)] != opening:
                raise SftDataError(f"{where}: this episode does not open as this model's chat format opens a "
                                   f"system turn ({tokenizer.decode(opening)!r}: ids {opening}; the episode's first "
                                   f"ids are {ids[: len(opening)]}): it was rendered with another tokenizer; render "
                                   "the data with this model's (`vivace sft data --model MODEL`)")  # fmt: skip
            return  # one episode tells: a file is rendered with one tokenizer


def jsonl_objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """("FILE:LINE", object) for each non-blank line of a JSONL file; a missing file, a line that is
    not UTF-8, not JSON or not a JSON object is an SftDataError naming the file and line."""
    check_files([path])
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # -sig: a byte-order mark is dropped
            except UnicodeDecodeError as e:
                raise SftDataError(f"{where}: not UTF-8 text (byte {e.start} of the line)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SftDataError(f"{where}: not JSON ({e.msg}); each line must be one JSON object") from None
            if not isinstance(row, dict):
                raise SftDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def check_files(paths: list[Path]) -> None:
    """An SftDataError for the first of `paths` that is not a file (missing, or a directory)."""
    for p in map(Path, paths):
        if p.is_dir():
            raise SftDataError(f"{p}: a directory, not a JSONL file; give the episode file inside it")
        if not p.is_file():
            raise SftDataError(f"{p}: no such file (write one with `vivace sft data --out {p}`)")


def group_steps(rows: list[tuple[list[int], int]], batch_tokens: int) -> list[list[list[int]]]:
    """Consecutive rows (episode indices, computed positions) per step while the step computes at most
    `batch_tokens` positions (at least one row)."""
    steps: list[list[list[int]]] = []
    tokens = 0
    for row, cost in rows:
        if not steps or tokens + cost > batch_tokens:
            steps.append([])
            tokens = 0
        steps[-1].append(row)
        tokens += cost
    return steps


PROBED = ("path", "old_string", "new_string")  # the tool-call arguments a policy has to copy or infer


def argument_spans(episodes: list[Episode], decode: Callable[[list[int]], str]) -> list[list[tuple[str, int, int]]]:
    """Per episode, the (argument, first, last) token positions of the trained `PROBED` values."""
    from vivace.rl.copying import argument_values

    spans = []
    for e in episodes:
        mask = [0] + [int(t != IGNORE) for t in e.labels[:-1]]  # position i is trained when i-1 predicts it
        spans.append(list(argument_values(e.ids, mask, decode, PROBED)))
    return spans


def only_paths(e: Episode, decode: Callable[[list[int]], str]) -> Episode:
    """The episode trained on the path values of its tool calls only (not their closing quote): the
    "paths" objective, which aims the whole gradient at copying a name the context shows."""
    from vivace.rl.copying import argument_values

    mask = [0] + [int(t != IGNORE) for t in e.labels[:-1]]
    keep = {j for _, first, last in argument_values(e.ids, mask, decode) for j in range(first, last)}
    return Episode(e.ids, [t if i + 1 in keep else IGNORE for i, t in enumerate(e.labels)])


def usable(episodes: list[Episode], longest: int) -> list[Episode]:
    """The episodes that fit `longest` tokens (a row and the context) and train at least one token."""
    return [e for e in episodes if len(e.ids) <= longest and any(t != IGNORE for t in e.labels)]


@torch.no_grad()
def evaluate(model, episodes: list[Episode], seq_len: int, spans: list[list[tuple[str, int, int]]] | None = None
             ) -> dict[str, float]:  # fmt: skip
    """Mean loss and greedy token accuracy over the trained tokens of `episodes`; with `spans`
    (argument_spans), per probed argument under teacher forcing: how often the first token of its
    value is the greedy choice (`eval_first_<arg>`) and how often the whole value is (`eval_exact_<arg>`)
    — the tokens that decide whether a call works, which the mean accuracy hides."""
    was_training = model.training
    model.eval()
    loss = correct = n = 0.0
    hits: dict[str, list[int]] = {f"{kind}_{a}": [] for a in PROBED for kind in ("first", "exact")}
    for row, _ in pack_episodes(episodes, seq_len):
        with _autocast(model):
            out, labels = forward_row(model, [episodes[i] for i in row], trained_only=True)
        logits = out.logits[0].float()
        loss += float(F.cross_entropy(logits, labels, reduction="sum"))
        right = (logits.argmax(-1) == labels).tolist()
        correct += sum(right)
        n += len(labels)
        offset = 0
        for i in row:  # trained positions come episode by episode, in order (the shared prefix trains none)
            trained = [j for j, t in enumerate(episodes[i].labels) if t != IGNORE]
            where = {j: offset + k for k, j in enumerate(trained)}
            for arg, first, last in spans[i] if spans else ():
                ok = [right[where[j - 1]] for j in range(first, last + 1) if j - 1 in where]
                if ok:
                    hits[f"first_{arg}"].append(int(ok[0]))
                    hits[f"exact_{arg}"].append(int(all(ok)))
            offset += len(trained)
    model.train(was_training)
    probes = {f"eval_{k}": round(sum(v) / len(v), 4) for k, v in hits.items() if v}
    return {"eval_loss": loss / max(n, 1.0), "eval_token_acc": correct / max(n, 1.0), "eval_tokens": int(n), **probes}


def evaluate_checkpoint(model_name: str, data: Path, seq_len: int = 16384, threads: int | None = None
                        ) -> dict[str, Any]:  # fmt: skip
    """`evaluate` of a saved policy (tiny or a checkpoint directory) on a held-out episode file: the
    numbers `train_sft`'s eval lines show, for comparing checkpoints on a probe without training."""
    from vivace.model.checkpoint import load_model

    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model_name)
    model, tokenizer = loaded.model, loaded.tokenizer
    model.set_attn_implementation(PACKED)
    longest = min(seq_len, model.config.max_position_embeddings)
    episodes = read_episodes(Path(data), min(len(tokenizer), model.config.vocab_size))
    kept = usable(episodes, longest)
    if not kept:
        raise SftDataError(_none_usable(episodes, longest, [Path(data)], "assistant"))
    result = evaluate(model, kept, seq_len, argument_spans(kept, tokenizer.decode))
    # What was left out, counted: models of other contexts would otherwise score other subsets unremarked.
    too_long = sum(len(e.ids) > longest for e in episodes)
    return {"model": model_name, "data": str(data), "episodes": len(kept), "read": len(episodes),
            "too_long": too_long, "untrained": len(episodes) - len(kept) - too_long, **result}  # fmt: skip


def _none_usable(episodes: list[Episode], longest: int, files: list[Path], objective: str) -> str:
    """Why no episode of `files` can be trained: none has a trained token, or those that do are too long."""
    trained = [e for e in episodes if any(t != IGNORE for t in e.labels)]
    named = ", ".join(map(str, files))
    if not trained and objective == "paths":
        return (f"{named}: no episode has a tool call with a path argument to train on (--objective paths trains "
                "those values only); use --objective assistant, or data from `vivace sft data`")  # fmt: skip
    if not trained:
        return f'{named}: no episode has a trained token (every "loss_mask" is all 0); nothing to learn from this data'
    shortest = min(len(e.ids) for e in trained)
    return (f"{named}: no episode with a trained token fits {longest} tokens (the shortest has {shortest}); "
            "raise --seq-len (up to the model's context)")  # fmt: skip


def lr_at(step: int, progress: float, lr: float, warmup: int, min_lr_ratio: float) -> float:
    """Linear warmup over `warmup` steps, then cosine from `lr` to `min_lr_ratio * lr` as progress goes 0→1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    cos = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * cos)


def pick_device(device: str) -> torch.device:
    """`auto`: the GPU when torch sees one, else the CPU; otherwise cpu, cuda or cuda:N, checked against
    what torch sees here (training is written for those two: meta, mps or xpu failed mid-setup)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA GPU here; use --device cpu (or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s) here (cuda:0 ...)")
    return dev


def _autocast(model):
    """bf16 autocast on a GPU (the weights and optimizer stay fp32); nothing on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=model.device.type == "cuda")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _init_model(init: str, overrides: dict | None, seed: int):
    from vivace.model.checkpoint import TINY_INIT, deepen, load_model, load_tokenizer, tiny_config

    if not overrides:
        loaded = load_model(init)
        return loaded.model, loaded.tokenizer
    if init != TINY_INIT:
        # Only depth can grow from trained weights (new identity layers); any other change would
        # silently drop `init`'s weights for a fresh model and lose a run.
        if set(overrides) != {"num_hidden_layers"}:
            raise ValueError(f"config overrides (--arch) other than num_hidden_layers make a fresh model: use them "
                             f"with init {TINY_INIT}, not {init!r}")  # fmt: skip
        loaded = load_model(init)
        return deepen(loaded.model, overrides["num_hidden_layers"], seed), loaded.tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer("tiny")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(len(tokenizer), **overrides), dtype=torch.float32), tokenizer


def _limit_training(model, rows: list[int] | None, freeze_embedding: bool) -> Callable[[], None]:
    """Freezes what `train_sft`'s `embedding_rows` / `freeze_embedding` keep out of training; returns
    what to call after each optimizer step (it puts the embedding's other rows back: AdamW's weight
    decay would otherwise move them)."""
    emb = model.get_input_embeddings().weight
    if rows is None:
        emb.requires_grad_(not freeze_embedding)
        return lambda: None
    if freeze_embedding:
        raise ValueError("embedding rows to train and a frozen embedding exclude each other; choose one")
    bad = [i for i in rows if not 0 <= i < emb.shape[0]]
    if bad or not rows:
        raise ValueError(f"embedding rows must be token ids 0..{emb.shape[0] - 1} (got {bad[:5] or 'none'})")
    for p in model.parameters():
        p.requires_grad_(p is emb)
    trained = torch.zeros(emb.shape[0], dtype=torch.bool, device=emb.device)
    trained[rows] = True
    emb.register_hook(lambda grad: grad * trained[:, None])
    kept = emb.detach()[~trained].clone()

    def restore() -> None:
        with torch.no_grad():
            emb[~trained] = kept

    return restore


def _save(model, tokenizer, out: Path) -> None:
    """Writes the checkpoint beside `out`, then moves each file in (an interrupted save leaves the last one whole,
    and removes its half-written files; only a kill leaves them, in OUT/.saving)."""
    from vivace.model.checkpoint import save_checkpoint

    tmp = out / ".saving"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_checkpoint(model, tokenizer, tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if failed_write := _os_error_of(e, tmp / "model.safetensors"):
            raise failed_write from e
        raise
    # config.json last: a directory with one is taken for a checkpoint (`--init`, the next run's --out check),
    # so a kill between the moves must not leave one beside no weights.
    for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
        os.replace(f, out / f.name)
    tmp.rmdir()


def _os_error_of(e: BaseException, path: Path) -> OSError | None:
    """The OSError a safetensors SafetensorError stands for when it is a failed write (a full disk: "... (os
    error 28)"), so that callers handle it as any other; None for any other error."""
    from safetensors import SafetensorError

    code = re.search(r"\(os error (\d+)\)", str(e)) if isinstance(e, SafetensorError) else None
    return OSError(int(code[1]), os.strerror(int(code[1])), str(path)) if code else None


def _diverged(what: str, step: int, lr: float, saved: int | None, out: Path) -> SftDiverged:
    """The error that stops a run whose `what` became non-finite, saying which save (if any) is kept."""
    kept = f"{out} keeps the save of step {saved}" if saved else "nothing was saved"
    return SftDiverged(f"training diverged: {what} became NaN or infinite at step {step} (learning rate {lr:g}); "
                       f"{kept}; train again with a lower --lr")  # fmt: skip


def _weights_finite(model) -> bool:
    """Whether every weight is a finite number (checkpoint._require_finite's check: one sum per tensor)."""
    from vivace.model.checkpoint import _require_finite

    try:
        _require_finite(model, "the model")
    except ValueError:
        return False
    return True


def _accumulate(model, batch: list[list[Episode]], aux_coef: float) -> tuple[float, float]:
    """Backward of one step, a row at a time: cross-entropy summed over trained tokens and divided by
    the step's count (a mean over the step however it is split), plus the router's balance loss
    weighted by each row's share of the step's tokens. Returns (loss, aux loss) of the step."""
    trained = sum(t != IGNORE for row in batch for e in row for t in e.labels)
    tokens = sum(row_tokens(row) for row in batch)
    ce_total = aux_total = 0.0
    for row in batch:
        with _autocast(model):
            out, labels = forward_row(model, row, router=aux_coef > 0, trained_only=True)
        ce = F.cross_entropy(out.logits[0].float(), labels, reduction="sum") / trained
        loss = ce
        if aux_coef > 0 and out.aux_loss is not None:
            aux = out.aux_loss * (row_tokens(row) / tokens)
            loss = loss + aux_coef * aux
            aux_total += float(aux.detach())
        loss.backward()
        ce_total += float(ce.detach())
    return ce_total, aux_total


def train_sft(
    data: list[Path],
    out: Path,
    *,
    init: str = "tiny",
    eval_data: Path | None = None,
    seq_len: int = 8192,
    batch_tokens: int = 16384,
    lr: float = 2e-3,
    min_lr_ratio: float = 0.1,
    warmup_steps: int = 20,
    weight_decay: float = 0.0,
    max_steps: int | None = None,
    epochs: float | None = None,
    time_budget_s: float | None = None,
    eval_every: int = 50,
    save_every: int = 200,
    seed: int = 0,
    threads: int | None = None,
    device: str = "auto",
    objective: str = "assistant",
    config_overrides: dict[str, Any] | None = None,
    embedding_rows: list[int] | None = None,
    freeze_embedding: bool = False,
    progress: Callable[[dict[str, Any]], None] = lambda record: None,
) -> dict[str, Any]:
    """Trains `init` on the episodes of `data`; writes the checkpoint, log and summary to `out`;
    returns the summary. `progress` gets every log line (step lines carry `planned_steps`).

    `objective` "paths" trains the path values of the tool calls only; the eval episodes keep the
    assistant mask, so eval numbers compare with any other run. `embedding_rows` trains those rows of
    the (tied) token embedding and nothing else; `freeze_embedding` trains everything but the
    embedding. Together they are the copy repair of docs/benchmarks.md ("A copy repair on 2 cores"):
    move the rows of tokens the policy cannot copy, then let the rest of the network catch up with
    the rows held where they are."""
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in locals().items() if k not in ("progress", "data")}
    data = [Path(p) for p in data]
    args["data"] = [str(p) for p in data]
    check_files([*data, *([Path(eval_data)] if eval_data else [])])
    if threads:
        torch.set_num_threads(threads)
    if max_steps is None and epochs is None and time_budget_s is None:
        epochs = 1.0
    dev = pick_device(device)
    random.seed(seed)
    model, tokenizer = _init_model(init, config_overrides, seed)
    model.to(dev)
    restore_rows = _limit_training(model, embedding_rows, freeze_embedding)
    args["device"] = str(dev)
    model.set_attn_implementation(PACKED)  # not saved: the checkpoint's config loads with the default
    torch.manual_seed(seed)
    longest = min(seq_len, model.config.max_position_embeddings)  # an episode must fit a row and the context
    vocab = min(len(tokenizer), model.config.vocab_size)
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose from {', '.join(OBJECTIVES)}")
    turn_start = None
    if objective == "dialogue":
        turn_start = require_turn_start(tokenizer, "the dialogue objective (train --objective assistant instead)")

    files, episodes = [], []
    for p in data:
        eps = read_episodes(p, vocab, turn_start)
        check_rendered_with(p, tokenizer)
        files.append({"path": str(p), "sha256": _sha256(p), "episodes": len(eps)})
        episodes += eps
    if objective == "paths":  # the training episodes only: the eval ones keep the assistant mask
        episodes = [only_paths(e, tokenizer.decode) for e in episodes]
    kept = usable(episodes, longest)
    too_long = sum(len(e.ids) > longest for e in episodes)
    counts = {"episodes": len(episodes), "kept": len(kept), "too_long": too_long,
              "untrained": len(episodes) - len(kept) - too_long}  # fmt: skip
    if not kept:
        raise SftDataError(_none_usable(episodes, longest, [Path(p) for p in data], objective))
    # The eval episodes keep the assistant mask whatever the objective, so that every run's eval numbers
    # (and `sft eval`'s) measure the same thing: what the policy writes.
    evals = read_episodes(Path(eval_data), vocab) if eval_data else []
    eval_info = None
    if eval_data:
        eval_info = {"path": str(eval_data), "sha256": _sha256(Path(eval_data)), "episodes": len(evals)}
        n_read, evals = len(evals), usable(evals, longest)
        if not evals:  # skipping the eval without a word left a run with no eval numbers at all
            raise SftDataError(f"--eval {eval_data}: none of its {n_read} episode(s) has a trained token and fits "
                               f"{longest} tokens; give a larger --seq-len, or other eval episodes")  # fmt: skip
        eval_info["kept"] = len(evals)
    eval_spans = argument_spans(evals, tokenizer.decode) if evals else None

    rng = random.Random(seed)
    rows = pack_episodes(kept, seq_len, rng)  # the system turn agent episodes share is computed once per row
    steps = group_steps(rows, batch_tokens)
    counts["rows"] = len(rows)
    counts["computed_tokens"] = sum(cost for _, cost in rows)
    counts["fill"] = round(counts["computed_tokens"] / (len(rows) * seq_len), 4)
    counts["steps_per_epoch"] = len(steps)
    budgets = [b for b in (max_steps, math.ceil(epochs * len(steps)) if epochs else None) if b is not None]
    planned = min(budgets) if budgets else None
    warmup = min(warmup_steps, planned // 4) if planned else warmup_steps

    out.mkdir(parents=True, exist_ok=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    has_router = getattr(model.config, "num_experts", 0) and getattr(model.config, "router_aux_loss_coef", 0)
    aux_coef = float(model.config.router_aux_loss_coef) if has_router else 0.0
    model.train()
    log = out / "train_log.jsonl"
    log.write_text("")
    state: dict[str, Any] = {"step": 0, "tokens": 0, "trained_tokens": 0, "loss": None, "stopped_by": None}
    last_eval: dict[str, float] = {}
    t0, busy, cursor = time.perf_counter(), 0.0, 0
    saved: int | None = None  # the step of the last save

    def record(line: dict[str, Any]) -> None:
        with log.open("a") as f:
            f.write(json.dumps(line) + "\n")
        progress(line)

    def run_eval() -> None:
        if evals:
            last_eval.update(evaluate(model, evals, seq_len, eval_spans))
            record({"step": state["step"], **last_eval})

    def summary(finished: bool) -> dict[str, Any]:
        elapsed = time.perf_counter() - t0
        from vivace.model.checkpoint import count_parameters

        result = {
            "finished": finished, "out": str(out), "args": args, "seed": seed, "data": files, "eval_data": eval_info,
            "counts": counts, "planned_steps": planned, "warmup_steps": warmup, **state,
            "epochs_done": round(state["step"] / counts["steps_per_epoch"], 4), "elapsed_s": round(elapsed, 2),
            "tok_s": round(state["tokens"] / busy, 1) if busy else None, "parameters": count_parameters(model),
            "aux_loss_coef": aux_coef, **last_eval,
        }  # fmt: skip
        write_atomic(out / "sft_summary.json", json.dumps(result, indent=2) + "\n")  # `sft ship` reads it
        return result

    try:
        while True:
            elapsed = time.perf_counter() - t0
            mean_step = busy / state["step"] if state["step"] else 0.0
            if max_steps is not None and state["step"] >= max_steps:
                state["stopped_by"] = "max_steps"
            elif epochs is not None and state["step"] >= math.ceil(epochs * counts["steps_per_epoch"]):
                state["stopped_by"] = "epochs"
            elif time_budget_s is not None and state["step"] and elapsed + mean_step > time_budget_s:
                state["stopped_by"] = "time_budget"  # the next step would overrun it
            if state["stopped_by"]:
                break
            if cursor == len(steps):  # a new epoch: new row order (ties re-drawn)
                steps, cursor = group_steps(pack_episodes(kept, seq_len, rng), batch_tokens), 0
            batch = [[kept[i] for i in row] for row in steps[cursor]]
            cursor += 1
            s0 = time.perf_counter()
            step_tokens = sum(len(e.ids) for row in batch for e in row)
            trained = sum(t != IGNORE for row in batch for e in row for t in e.labels)
            p_steps = (state["step"] - warmup) / max(planned - warmup, 1) if planned else 0.0
            p_time = elapsed / time_budget_s if time_budget_s else 0.0
            lr_now = lr_at(state["step"], max(p_steps, p_time), lr, warmup, min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr_now
            optimizer.zero_grad(set_to_none=True)
            ce_total, aux_total = _accumulate(model, batch, aux_coef)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP))
            if not (math.isfinite(ce_total) and math.isfinite(grad_norm)):  # the step would poison every weight
                raise _diverged("the loss" if not math.isfinite(ce_total) else "the gradient", state["step"] + 1,
                                lr_now, saved, out)  # fmt: skip
            # Ctrl-C here would save a step half applied (some weights updated, others not, its NaN check
            # skipped): a signal waits until the step is applied, checked and counted.
            with deferred_signals():
                optimizer.step()
                restore_rows()
                if not _weights_finite(model):  # a step too large: nothing past here is logged or saved
                    raise _diverged("the weights", state["step"] + 1, lr_now, saved, out)
                dt = time.perf_counter() - s0
                busy += dt
                state["step"] += 1
                state["tokens"] += step_tokens
                state["trained_tokens"] += trained
                state["loss"] = ce_total
                if time_budget_s is not None and not planned:  # steps that fit the time left, for the progress bar
                    left = max(time_budget_s - (time.perf_counter() - t0), 0.0)
                    est = state["step"] + int(left / (busy / state["step"]))
                    # a time budget alone: warmup of at most a quarter of the steps it fits, as measured so far
                    # (only ever shortened: a slower step later must not send the rate back into the ramp)
                    warmup = min(warmup, max(est // 4, 1))
                else:
                    est = planned
                record({"step": state["step"], "loss": round(ce_total, 5), "aux_loss": round(aux_total, 5),
                        "tokens": step_tokens, "trained_tokens": trained, "tok_s": round(step_tokens / dt, 1),
                        "lr": lr_now, "elapsed_s": round(time.perf_counter() - t0, 2),
                        "grad_norm": round(grad_norm, 5), "planned_steps": est})  # fmt: skip
            if eval_every and state["step"] % eval_every == 0:
                run_eval()
            if save_every and state["step"] % save_every == 0:
                _save(model, tokenizer, out)
                saved = state["step"]
                summary(finished=False)
    except KeyboardInterrupt:  # Ctrl-C: keep what was learned (the step in flight is dropped)
        state["stopped_by"] = "interrupted"
    if evals and state["stopped_by"] != "interrupted" and (not eval_every or state["step"] % eval_every):
        run_eval()
    _save(model, tokenizer, out)
    return summary(finished=state["stopped_by"] != "interrupted")  # stopped short of its budget: not finished
