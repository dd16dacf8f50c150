"""Reading generated tokens as text while they arrive, in time linear in the output.

What: `Detokenizer` turns a growing list of token ids into text deltas by decoding only a small
window (the "prefix offset / read offset" technique of vLLM and text-generation-inference);
`StopFinder` finds the first stop string in those deltas; `ContentStream` says which part of a
chat reply's text can be streamed as content yet. The server uses them for streamed and whole
replies alike, so both end at the same place. `TokenBytes` gives a token's own bytes (logprobs'
`bytes`), which a token's decoded text loses when it holds part of a character.

Why a window: decoding everything at every token is quadratic in the output. Decoding only from
a few tokens back is exact because the window always starts on a character boundary: a window is
advanced only when its text does not end with U+FFFD (the mark of an incomplete UTF-8 sequence),
and decoding from the start of the previous delta (not the new token alone) keeps tokenizers that
drop a leading space at the start of a decode (SentencePiece) from dropping it here.

Not guaranteed: exactness for tokenizers whose decoding of a token depends on tokens more than
one delta back (byte-level BPE does not, and is what the tests check against a whole decode); a
U+FFFD that the model really generates at the end of the text is held back until a following
token (or `flush`) releases it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Sequence
from typing import Any


class Detokenizer:
    """Incremental decoding: the deltas of `add` followed by `flush` concatenate to
    `decode(ids)`, the ids in `skip` left out."""

    def __init__(self, decode: Callable[[Sequence[int]], str], skip: Container[int] = ()):
        self.decode, self.skip = decode, skip
        self.ids: list[int] = []
        self.prefix = 0  # the window starts here: the first id of the previous delta
        self.read = 0  # ids before this are text already returned

    def add(self, token: int) -> str:
        """The text `token` completes (often empty: a character still incomplete)."""
        if token in self.skip:
            return ""
        self.ids.append(token)
        before = self.decode(self.ids[self.prefix : self.read])
        after = self.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """What `add` held back (an incomplete character, decoded as U+FFFD)."""
        before = self.decode(self.ids[self.prefix : self.read])
        after = self.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


class TokenBytes:
    """Each token's own bytes: what OpenAI's logprobs report as `bytes`, so a client can join them
    into the text even where a token holds part of a character (byte-level BPE splits an emoji or
    a CJK character over tokens that each decode alone to U+FFFD).

    A byte-level BPE vocabulary (GPT-2's, Qwen's, Llama 3's) spells each byte as one character,
    mapped back here through the same table; an added token (<|im_end|>) is its text; a
    SentencePiece byte token (<0xE2>) its byte. Any other token is the UTF-8 of the text it adds
    after an anchor token ("a"), which is its bytes when it holds whole characters: decoded alone,
    a SentencePiece token loses its leading space (Llama 2's decoder strips a decode's first one, so
    "▁Hello" would be "Hello" and the tokens would join without their spaces)."""

    def __init__(self, tokenizer: Any):
        from tokenizers import decoders
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.tokenizer = tokenizer
        self.added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        byte_level = backend is not None and isinstance(backend.decoder, decoders.ByteLevel)
        self.byte_of = {c: b for b, c in bytes_to_unicode().items()} if byte_level else {}
        anchor = tokenizer.encode("a", add_special_tokens=False)[-1:]
        self.anchor, self.anchor_text = anchor, self._decode(anchor)

    def __call__(self, token: int) -> bytes:
        if token in self.added:
            return self.added[token].encode()
        piece = self.tokenizer.convert_ids_to_tokens(token) or ""
        if piece and self.byte_of and all(c in self.byte_of for c in piece):
            return bytes(self.byte_of[c] for c in piece)
        if m := _BYTE_FALLBACK.fullmatch(piece):
            return bytes([int(m.group(1), 16)])
        after = self._decode([*self.anchor, token])
        if self.anchor_text and after.startswith(self.anchor_text):
            return after[len(self.anchor_text) :].encode()
        return self._decode([token]).encode()

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class StopFinder:
    """The first stop string in a text given as deltas, looking only at the new text and the few
    characters before it that a stop string could begin in."""

    def __init__(self, stops: Sequence[str]):
        self.stops = list(stops)
        self.keep = max(map(len, self.stops), default=1) - 1
        self.tail = ""  # the text's last `keep` characters
        self.length = 0  # characters fed so far

    def feed(self, delta: str) -> int | None:
        """Where (in all the text fed) the first stop string starts, once one is complete."""
        window = self.tail + delta
        start = self.length - len(self.tail)
        self.length += len(delta)
        self.tail = window[len(window) - self.keep :] if self.keep else ""
        # A stop string wholly inside the old tail was found when it completed: any hit is new.
        hits = [i for i in (window.find(s) for s in self.stops) if i >= 0]
        return start + min(hits) if hits else None


def held(text: str, patterns: Sequence[str]) -> int:
    """How many trailing characters of `text` could begin one of `patterns` (not yet safe to show)."""
    return max((k for s in patterns for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


class ContentStream:
    """The content of a chat reply as its text grows, sent only once sure: the reply strips its
    content, ends it before a stop string, and (with tools) before the first `open_tag`, so
    leading whitespace is dropped and trailing whitespace, a possible stop string's beginning or
    a possible tag's beginning are held back. What `feed` returns, concatenated (`sent`), is
    always a prefix of the final content when the reply's content is the text so read."""

    def __init__(self, stops: Sequence[str], open_tag: str | None):
        self.open_tag = open_tag
        self.holds = [*stops, *([open_tag] if open_tag else [])]
        self.pending = ""  # read, not sent: whitespace or what may begin a stop string or tag
        self.pieces: list[str] = []
        self.closed = False  # a tool call began: the rest is not streamed as content

    def feed(self, delta: str) -> str:
        if self.closed:
            return ""
        text = self.pending + delta
        if self.open_tag and self.open_tag in text:
            text, self.closed = text.split(self.open_tag, 1)[0], True
        if not self.pieces:
            text = text.lstrip()
        ready = text[: len(text) - held(text, self.holds)].rstrip()
        self.pending = text[len(ready) :]
        if ready:
            self.pieces.append(ready)
        return ready

    @property
    def sent(self) -> str:
        return "".join(self.pieces)
