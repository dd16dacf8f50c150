"""The reference tokenizer: a byte-level BPE that vivace trains on code and on harness conversations.

What: `train_tokenizer` (the `tokenizers` library's BPE with Qwen2's pre-tokenizer split, the chat
control tokens as single special tokens, and vivace's chat template), `save_tokenizer`, and
`reference_tokenizer()`, the copy shipped in `assets/tokenizer/`, which plain
`transformers.AutoTokenizer` loads. `count_assistant_tokens` is how the benchmark counts every
model's output with this one tokenizer. What it is trained on is `model/corpus.py`.

Why: nothing is fetched at run time, so the tiny policy's tokenizer is built here; and token
counts of different models are only comparable when one tokenizer counts them.

Byte-level with no normalizer: every string encodes and decodes back exactly (no NFC, no unknown
token). Deterministic: the same texts and vocabulary size give the same tokenizer.

Not covered: SentencePiece/unigram models, other model families' tokenizers (a policy loaded from a
Hugging Face checkpoint keeps its own), `<think>` tokens.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from vivace.harness.chat import END_OF_TEXT, END_OF_TURN, QWEN_TEMPLATE, SPECIAL_TOKENS, ChatFormat
from vivace.harness.messages import Message

# Qwen2's pre-tokenizer split: newlines glue to each other and to preceding punctuation, which is
# where a careless chat format would tokenize differently across turn boundaries.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
REFERENCE_DIR = Path(__file__).parent / "assets" / "tokenizer"
REFERENCE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
DEFAULT_VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 32768
_CONTROL = re.compile("|".join(map(re.escape, SPECIAL_TOKENS)))


# ---- training, saving, loading ----------------------------------------------------------------------


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` tokens (control tokens and the 256 bytes included)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (256 bytes + the control tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Encoding cuts control tokens out before pre-tokenizing, so the trainer sees the text between them.
    tok.train_from_iterator((piece for text in texts for piece in _CONTROL.split(text) if piece), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=QWEN_TEMPLATE,
        eos_token=END_OF_TURN,
        pad_token=END_OF_TEXT,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> dict[str, int]:
    """Writes the Hugging Face files into `out_dir`; returns {file name: bytes}."""
    out = Path(out_dir)
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # transformers 5 writes its own backend class name; the generic one also loads in 4.x.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}


@functools.cache
def reference_tokenizer() -> PreTrainedTokenizerBase:
    """The shipped reference tokenizer (loaded once per process; do not modify it)."""
    missing = [f for f in REFERENCE_FILES if not (REFERENCE_DIR / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the reference tokenizer is incomplete: {', '.join(missing)} missing from {REFERENCE_DIR}; "
            "the install is damaged: reinstall vivace (in a checkout, `git checkout -- src/vivace/model/assets`)"
        )
    from transformers import AutoTokenizer  # imports torch: only when loading

    return AutoTokenizer.from_pretrained(str(REFERENCE_DIR), local_files_only=True)


@functools.cache
def reference_chat_format() -> ChatFormat:
    return ChatFormat(reference_tokenizer())


def count_assistant_tokens(messages: Iterable[Message]) -> int:
    """Reference tokens of assistant messages as a model generates them (`ChatFormat.assistant_ids`:
    text, tool-call blocks and the end-of-turn token), whatever tokenizer the model used."""
    fmt = reference_chat_format()
    return sum(len(fmt.assistant_ids(m)) for m in messages)


def chars_per_token(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> float:
    """Compression: characters per token over `texts` (control tokens count as one token each)."""
    if not texts:
        return 0.0
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return sum(map(len, texts)) / max(1, sum(map(len, ids)))
