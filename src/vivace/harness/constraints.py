"""Tool-argument constraints: while a token-level policy writes a `read_file` path or an
`edit_file` old_string, only tokens that keep the value something that exists are allowed.

Why: a small policy often knows *which* file or line it wants but cannot copy an unseen name
exactly — it keeps the first piece of `kitchen/core.py` and invents the rest (`kitanten`), and its
old_strings are invented fragments that never match (docs/benchmarks.md, where h2's held-out
episodes fail). A path that does not exist and an old_string that is not in the file can only
ever produce an error, so masking them costs a policy nothing it could use, the way grammar-
constrained decoding keeps tool calls well-formed. What is left to the policy is the choice:
which file, which fragment, and what to write instead (new_string is never constrained).

What: `ArgumentValues` (the workspace's files and the current text of the files read so far)
and `ArgumentConstraint`, a sampler hook: given the tokens generated in this turn, the token ids
allowed next (None: no constraint at this point). The mask acts like top-k truncation: the
logprob reported for a sampled token is under the unmasked distribution, which is what a trainer
recomputes, so RL needs nothing else.

Not covered: values written with escapes other than the chat template's own (`\\u00e9`, `\\/`);
a token whose text is not valid UTF-8 on its own is never allowed inside a constrained value.
`edit_file` paths are not constrained (an edit with an empty old_string creates a file).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from vivace.harness.chat import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PATH = re.compile(r'"path"\s*:\s*"((?:[^"\\]|\\.)*)"')
# The value being written: a key, then an open string running to the end of the text.
_OPEN_VALUE = re.compile(r'"(path|old_string)"\s*:\s*"((?:[^"\\]|\\.)*\\?)$')


def escape(value: str) -> str:
    """A string as it appears between the quotes of the chat template's JSON."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


@dataclass(frozen=True)
class ArgumentValues:
    """What may be written: `paths` for read_file, and old_strings that are substrings of `contents[path]`."""

    paths: tuple[str, ...] = ()
    contents: dict[str, str] = field(default_factory=dict)


class ArgumentConstraint:
    """Allowed next tokens for one turn of one policy. `token_texts[i]` is token i's text (None for
    byte pieces that are not text on their own)."""

    def __init__(self, values: ArgumentValues, token_texts: Sequence[str | None]):
        self.token_texts = token_texts
        self.paths = [escape(p) for p in values.paths]
        self.contents = {escape(p): escape(text) for p, text in values.contents.items()}
        self._text = ""  # the turn's text so far (tokens appended as they are generated)
        self._seen = 0

    def allowed(self, generated: Sequence[int]) -> list[int] | None:
        for t in generated[self._seen :]:
            self._text += self.token_texts[t] or ""
        self._seen = len(generated)
        call = self._open_call()
        if call is None:
            return None
        value = _OPEN_VALUE.search(call)
        name = _NAME.search(call)
        if value is None or name is None:
            return None
        key, partial = value.group(1), value.group(2)
        if key == "path" and name.group(1) == "read_file":
            fits = _after_prefix([p for p in self.paths if p.startswith(partial)], len(partial), whole=True)
        elif key == "old_string" and name.group(1) == "edit_file":
            path = _PATH.search(call)
            content = self.contents.get(path.group(1)) if path else None
            if content is None:
                return None
            fits = _in_text(content, partial)
        else:
            return None
        keep = [i for i, s in enumerate(self.token_texts) if s and _continues(partial, s, fits)]
        return keep or None  # nothing fits (a value already off the allowed set): leave the policy free

    def _open_call(self) -> str | None:
        """The body of the tool call being written, if one is open."""
        start = self._text.rfind(TOOL_CALL_OPEN)
        if start < 0 or self._text.find(TOOL_CALL_CLOSE, start) >= 0:
            return None
        return self._text[start + len(TOOL_CALL_OPEN) :]


def _after_prefix(values: list[str], n: int, whole: bool):
    """fits(more, closed) for values that all start with the n characters written so far: `more`
    must continue one of them, and a closed value must be one of them (`whole`) or any cut of one."""
    rests = [v[n:] for v in values]
    ends = set(rests)

    def fits(more: str, closed: bool) -> bool:
        if closed:
            return more in ends if whole else any(r.startswith(more) for r in rests)
        return any(r.startswith(more) for r in rests)

    return fits


def _in_text(text: str, partial: str, most: int = 64):
    """fits(more, closed) for substrings of `text` (an old_string): partial + more must occur in it.
    Few occurrences of partial: compare against what follows each; else search the whole text."""
    if partial:
        starts = [m.start() for m in re.finditer(re.escape(partial), text)][: most + 1]
        if len(starts) <= most:
            return _after_prefix([text[s : s + len(partial) + 64] for s in starts], len(partial), whole=False)
    return lambda more, closed: (partial + more) in text


def _continues(partial: str, piece: str, fits) -> bool:
    """Whether `piece` may follow the escaped value `partial`: up to an unescaped quote the value
    must stay allowed-so-far; a quote closes it, the closed value must be allowed whole, and what
    follows in the piece must go on as JSON does after a value (`,` or `}`)."""
    escaped = _ends_in_escape(partial)
    for i, ch in enumerate(piece):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            after = piece[i + 1 :].lstrip()
            return (not after or after[0] in ",}") and fits(piece[:i], True)
    return fits(piece, False)


def _ends_in_escape(text: str) -> bool:
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def token_texts(tokenizer) -> list[str | None]:
    """Each token id's text, for ArgumentConstraint (control tokens as their tags: `<tool_call>`
    opens a call); None for byte pieces that do not decode to text alone."""
    texts: list[str | None] = []
    for i in range(len(tokenizer)):
        s = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        texts.append(None if "\ufffd" in s else s)
    return texts
