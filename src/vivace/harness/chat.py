"""The chat format: how a conversation becomes the tokens a model reads, and how the tokens a
model generates become an assistant message again.

What: a Qwen2.5/Qwen3-style template with tools (`QWEN_TEMPLATE`) and `ChatFormat`, which wraps
a Hugging Face tokenizer to render, encode, continue and parse conversations.

Which template: the tokenizer's own when it can carry the harness's conversations (it shows the
tools, writes calls as the `<tool_call>` blocks `parse` reads, keeps tool results, ends a turn with
a control token, and is prefix-stable, see below), checked once by rendering a probe conversation;
else QWEN_TEMPLATE, with a warning that says why. So a Llama 3 or Mistral checkpoint, or a Qwen3 one
whose template writes `<think>` into the last turn, runs with vivace's format instead of silently
losing its tools or failing on its second turn; a tokenizer with no `<|im_end|>` token gets that
template with its eos token ending each turn, so generation stops where the model ends its text.
It also stops at every id the checkpoint's generation_config.json lists as `eos_token_id` (Llama 3
Instruct ends a turn with <|eot_id|>, which is not its tokenizer's eos), read from the directory
the tokenizer was loaded from (`tokenizer.name_or_path`).

Why token-in/token-out: an RL rollout must train on exactly the tokens the model sampled, so the
past is never re-tokenized. A rollout holds one growing token sequence: the prompt, then each
assistant turn's sampled ids as generated (ending with the end-of-turn token), then
`continuation_ids` for what follows (tool results, a user turn, the next generation prompt).
That works because the template is *prefix-stable*: rendering `messages[:k]` is a prefix of
rendering `messages[:k+1]` up to the end of its last `<|im_end|>`; nothing earlier is rendered
differently because of what comes later (so no Qwen3-style `<think>` stripping). A template that
breaks this makes `continuation_ids` raise instead of silently training on a different text.
Consecutive tool results form one user turn, so the property is only promised (and only
needed) where the earlier rendering ends with an assistant turn.

Control tokens inside message text (a tool result showing this file, say) are encoded as plain
text on the token path (`prompt_ids`, `continuation_ids`, `assistant_ids`), so a file's
`<|im_end|>` never ends a turn; `parse(ids)` likewise only takes the real tokens as tags (a
text cannot tell them apart, so `parse(text)` takes every tag it finds). `render` returns the
text for display: the tokens `prompt_ids` gives, decoded (and also encoded by `encode`, unless a
message holds a control token's text).

Not covered here: `<think>` reasoning, images, loading tokenizers or models, running tools, and
tokenizers whose encoding of a text depends on where the text starts (SentencePiece's leading
space; the byte-level BPE of Qwen-like models does not).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from vivace.harness.messages import Message, SpelledArguments, ToolCall, decode_call

log = logging.getLogger(__name__)

END_OF_TURN = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = [
    "<|im_start|>",
    END_OF_TURN,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    END_OF_TEXT,
]

# Jinja escapes ('\n') are the template's own; Hugging Face compiles templates with
# trim_blocks and lstrip_blocks, and every tag here strips whitespace, so only the string
# literals make text.
QWEN_TEMPLATE = r"""
{%- if messages and messages[0].role == 'system' %}
    {%- set system = messages[0].content %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system = '' %}
    {%- set turns = messages %}
{%- endif %}
{%- if system or tools %}
    {{- '<|im_start|>system\n' }}
    {{- system }}
    {%- if tools %}
        {%- if system %}
            {{- '\n\n' }}
        {%- endif %}
        {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
        {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
        {%- for tool in tools %}
            {{- '\n' }}
            {{- tool | tojson }}
        {%- endfor %}
        {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' }}
        {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
        {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n' }}
        {{- 'You may make several calls in one turn, each in its own <tool_call></tool_call> block.' }}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in turns %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {{- message.content }}
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if message.content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": ' }}
            {{- fn.name | tojson }}
            {{- ', "arguments": ' }}
            {%- if fn.arguments is mapping %}
                {{- fn.arguments | tojson }}
            {%- else %}
                {{- fn.arguments }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or turns[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or turns[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {{- message.content }}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Private-use characters that wrap control tokens found in message text while rendering, so the
# encoder can tell them from the template's own (the idea of transformers' sanitize_control_tokens).
_MARK_START, _MARK_END = "\U000f0000", "\U000f0001"
_MARKED = re.compile(f"{_MARK_START}(.*?){_MARK_END}", re.S)
_NAME = re.compile(r'"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ALL_TAG_RE = re.compile("(" + "|".join(map(re.escape, SPECIAL_TOKENS)) + ")")
_TEXT = False  # piece kinds in a parsed turn: text, or a control tag
_TAG = True
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


class ChatFormat:
    """Renders, encodes and parses conversations for one tokenizer and one template."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        template: str | None = None,
        end_of_turn: str = END_OF_TURN,
        eos_ids: Sequence[int] | None = None,
    ) -> None:
        """`eos_ids`: more ids that end generation; None reads them from the generation_config.json
        of the directory the tokenizer was loaded from (a checkpoint's), if it has one."""
        self.tokenizer = tokenizer
        vocab = tokenizer.get_added_vocab()
        # Whitespace tokens (Gemma's "\n") are ordinary text in templates and messages alike.
        controls = sorted((t for t in vocab if t and not t.isspace()), key=len, reverse=True)
        self._control_re = re.compile("|".join(map(re.escape, controls))) if controls else None
        self._added_ids = set(vocab.values())
        # Why the tokenizer's own template is not the one used (None: it is, or it has none).
        self.template_note: str | None = None
        if template:
            self.template, self.end_of_turn = template, end_of_turn
            self.template_name = _template_name(tokenizer, template, from_tokenizer=False)
        else:
            self._choose_template(_own_template(tokenizer))
        # Whether the tokenizer's own template is the one rendered: if not, a model trained here learns
        # vivace's format, and a checkpoint saved from it carries that template (save_companions).
        self.own_template = self.template == _own_template(tokenizer)
        eos = tokenizer.eos_token if isinstance(tokenizer.eos_token, str) else None
        ends = [t for t in dict.fromkeys((self.end_of_turn, END_OF_TEXT, eos)) if t and self._single_id(t) is not None]
        # A turn ends at the template's end-of-turn token, or where the model ends the text: its
        # tokenizer's eos, or any id its generation config names (Llama 3's <|eot_id|> and <|eom_id|>).
        stops = {self._single_id(t): t for t in ends}
        stops.update((i, self.decode([i])) for i in self._generation_eos(eos_ids) if i not in stops)
        self.stop_ids = list(stops)
        self.context_tokens = self._declared_context()
        # Stripped off a turn's end.
        self._end_tags = tuple(dict.fromkeys((self.end_of_turn, END_OF_TEXT, *stops.values())))
        self._tag_of_id = {vocab[t]: t for t in SPECIAL_TOKENS if t in vocab}
        self._tag_of_id.update(stops)
        # What a served reply's text leaves out (vLLM's skip_special_tokens): the end tokens and the
        # tokenizer's special tokens, but not the tool markup replies are parsed from (special in
        # vivace's tokenizer, plain added tokens in Qwen's).
        markup = {vocab.get(t) for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)}
        special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self.special_ids = frozenset((special - markup) | set(self.stop_ids))
        # Tags this tokenizer has no token for can only be generated as text, so parse finds them there.
        text_tags = [t for t in SPECIAL_TOKENS if t not in vocab]
        self._text_tag_re = re.compile("(" + "|".join(map(re.escape, text_tags)) + ")") if text_tags else None

    def _choose_template(self, own: str | None) -> None:
        """The tokenizer's own template when the harness can use it (it shows the tools, writes
        calls as the <tool_call> blocks `parse` reads, keeps tool results, ends turns with a token
        and is prefix-stable), else QWEN_TEMPLATE with a warning that says why. A checkpoint made
        for another chat format (Llama 3, Mistral's [INST], Qwen3's <think> stripping) then runs
        with vivace's format, which it reads without having been trained on it."""
        if own and own != QWEN_TEMPLATE:
            problem, end_of_turn = _template_problem(self.tokenizer, own, self._control_re)
            if problem is None:
                self.template, self.end_of_turn = own, end_of_turn
                self.template_name = _template_name(self.tokenizer, own, from_tokenizer=True)
                return
            self.template_note = f"{_template_name(self.tokenizer, own, from_tokenizer=True)} {problem}"
        self.template, self.end_of_turn = QWEN_TEMPLATE, END_OF_TURN
        self.template_name = _template_name(self.tokenizer, QWEN_TEMPLATE, from_tokenizer=False)
        eos = self.tokenizer.eos_token if isinstance(self.tokenizer.eos_token, str) else None
        if self._single_id(END_OF_TURN) is None and eos and self._single_id(eos) is not None:
            # No <|im_end|> token (Llama, Mistral vocabularies): the model's own end-of-text token ends
            # each turn, so generation stops there instead of running to max_tokens every turn.
            quoted = eos.replace("\\", "\\\\").replace("'", "\\'")
            self.template, self.end_of_turn = QWEN_TEMPLATE.replace(END_OF_TURN, quoted), eos
            self.template_name += f" with {eos} ending each turn"
        elif self._single_id(END_OF_TURN) is None:
            stuck = f"the tokenizer has no {END_OF_TURN} or eos token, so a turn ends only at max_tokens"
            self.template_note = f"{self.template_note}; {stuck}" if self.template_note else stuck
        if self.template_note:
            log.warning("%s; using %s instead", self.template_note, self.template_name)

    def _declared_context(self) -> int | None:
        """The model's context, by the config.json beside the tokenizer (a checkpoint's); None: unknown."""
        from vivace.model.checkpoint import declared_context  # (the one reader of checkpoint files)

        directory = _directory(self.tokenizer)
        return declared_context(directory) if directory else None

    def _generation_eos(self, eos_ids: Sequence[int] | None) -> list[int]:
        """The given end ids, or those of the tokenizer's checkpoint's generation_config.json; ids
        outside the tokenizer's vocabulary are left out with a warning (no text, nothing to parse)."""
        source = "eos_ids"
        if eos_ids is None:
            from vivace.model.checkpoint import generation_eos_ids  # (the one reader of checkpoint files)

            directory = _directory(self.tokenizer)
            source = f"{directory}/generation_config.json's eos_token_id"
            eos_ids = generation_eos_ids(directory) if directory else []
        size = len(self.tokenizer)
        outside = [i for i in eos_ids if not 0 <= i < size]
        if outside:
            log.warning("%s %s not in the tokenizer's %d ids; ignored", source, outside, size)
        return [i for i in eos_ids if 0 <= i < size]

    def _single_id(self, text: str) -> int | None:
        """The id of a text that is one token (a control token), else None."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    # ---- rendering and encoding -------------------------------------------------------------

    def render(
        self, messages: Sequence[Message], tools: Sequence[dict] | None = None, add_generation_prompt: bool = False
    ) -> str:
        """The conversation as text (for display; the token path is `prompt_ids`)."""
        return _unmark(self._render_marked(messages, tools, add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """Token ids of a text, control tokens included, without any added BOS/EOS."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
        """The whole conversation followed by the generation prompt."""
        return self._encode_marked(self._render_marked(messages, tools, True))

    def continuation_ids(self, messages: Sequence[Message], tools: Sequence[dict] | None, n_prior: int) -> list[int]:
        """The ids to append to a sequence holding `messages[:n_prior]` (whose last message is an
        assistant turn, its sampled ids ending with the end-of-turn token) so that it then holds
        `messages` and the generation prompt."""
        if not 0 < n_prior <= len(messages) or messages[n_prior - 1].role != "assistant":
            raise ValueError(f"continuation_ids needs messages[{n_prior - 1}] to be an assistant turn")
        prior = self._render_marked(messages[:n_prior], tools, False)
        cut = self._after_last_end_of_turn(prior)
        full = self._render_marked(messages, tools, True)
        if cut is None or not full.startswith(prior[:cut]):
            raise ValueError(
                f"{self.template_name} is not prefix-stable: rendering the first {n_prior} messages up to its last "
                f"{self.end_of_turn} is not a prefix of rendering all {len(messages)}, so the sampled tokens cannot "
                "be continued without re-tokenizing the past (templates that rewrite earlier turns, such as "
                "stripping <think>, cannot be used token-in/token-out)"
            )
        return self._encode_marked(full[cut:])

    def assistant_text(self, message: Message) -> str:
        """What a model must generate for this assistant message, ending with the end-of-turn token."""
        return _unmark(self._assistant_marked(message))

    def assistant_ids(self, message: Message) -> list[int]:
        return self._encode_marked(self._assistant_marked(message))

    def _assistant_marked(self, message: Message) -> str:
        # Derived from the template: the rendering with the message minus the generation prompt before it.
        if message.role != "assistant":
            raise ValueError(f"assistant_ids needs an assistant message, got a {message.role} message")
        context = [Message("user", "?")]
        before = self._render_marked(context, None, True)
        after = self._render_marked([*context, message], None, False)
        cut = self._after_last_end_of_turn(after)
        if not after.startswith(before) or cut is None or cut <= len(before):
            raise ValueError(f"{self.template_name} does not render this assistant message after its generation prompt")
        return after[len(before) : cut]

    def _render_marked(self, messages: Sequence[Message], tools: Sequence[dict] | None, gen: bool) -> str:
        conversation = [self._mark(_template_dict(m)) for m in messages]
        return self.tokenizer.apply_chat_template(
            conversation,
            tools=self._mark(list(tools)) if tools else None,
            chat_template=self.template,
            add_generation_prompt=gen,
            tokenize=False,
        )

    def _mark(self, obj: Any) -> Any:
        """Wraps control tokens in the strings of messages and tools with the private markers."""
        if isinstance(obj, str):
            obj = obj.replace(_MARK_START, "").replace(_MARK_END, "")  # markers cannot be forged
            return (
                self._control_re.sub(lambda m: _MARK_START + m.group(0) + _MARK_END, obj) if self._control_re else obj
            )
        if isinstance(obj, dict):
            return {k: self._mark(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self._mark(v) for v in obj]
        return obj

    def _encode_marked(self, text: str) -> list[int]:
        """Encodes a marked rendering: marked control tokens as plain text, the rest as usual."""
        parts = _MARKED.split(text)
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                ids += self._encode_as_text(part)
            elif part:
                ids += self.encode(part.replace(_MARK_START, "").replace(_MARK_END, ""))
        return ids

    def _encode_as_text(self, token: str) -> list[int]:
        # Splitting off the first character keeps the added-token matcher from seeing the whole
        # token (split_special_tokens would not cover non-special added tokens such as Qwen's <tool_call>).
        ids = self.encode(token[:1]) + self.encode(token[1:])
        if self._added_ids.intersection(ids):
            ids = [i for ch in token for i in self.encode(ch)]
        return ids

    def _after_last_end_of_turn(self, text: str) -> int | None:
        """The index just past the template's last end-of-turn token (not one inside message text)."""
        i = text.rfind(self.end_of_turn)
        while i > 0 and text[i - 1] == _MARK_START:
            i = text.rfind(self.end_of_turn, 0, i)
        return None if i < 0 else i + len(self.end_of_turn)

    # ---- parsing ------------------------------------------------------------------------------

    def parse(self, output: str | Sequence[int], finish_reason: str = "stop") -> tuple[Message, int]:
        """The assistant message in a generated turn, and how many format errors it has.

        Each malformed block (or stray tag) becomes a ToolCall with `error` set, so the error goes
        back to the model as that call's result; the other calls of the turn are unaffected."""
        return _parse_pieces(self._pieces(output), self._end_tags, finish_reason)

    def _pieces(self, output: str | Sequence[int]) -> list[tuple[bool, str]]:
        """The turn as text pieces and control tags. From ids only the real tokens are tags."""
        if isinstance(output, str):
            return _split(output, _ALL_TAG_RE)
        pieces: list[tuple[bool, str]] = []
        run: list[int] = []
        for token in [*output, None]:
            tag = self._tag_of_id.get(token) if token is not None else None
            if tag is None and token is not None:
                run.append(token)
                continue
            if run:
                pieces += _split(self._decode_leniently(run), self._text_tag_re)
                run = []
            if tag is not None:
                pieces.append((_TAG, tag))
        return pieces

    def _decode_leniently(self, ids: list[int]) -> str:
        try:
            return self.decode(ids)
        except (OverflowError, TypeError, ValueError):  # ids no sampler makes (negative, say): one per token
            return "".join(self._decode_leniently([i]) for i in ids) if len(ids) > 1 else "\ufffd"


def parse_text(text: str, finish_reason: str = "stop") -> tuple[Message, int]:
    """`ChatFormat.parse` for generated text with the standard tags, without a tokenizer (replayed
    or API-returned text; every tag spelled in the text counts as a tag)."""
    return _parse_pieces(_split(text, _ALL_TAG_RE), (END_OF_TURN, END_OF_TEXT), finish_reason)


def _parse_pieces(pieces: list[tuple[bool, str]], end_tags: Sequence[str], finish_reason: str) -> tuple[Message, int]:
    ends = [(_TAG, t) for t in end_tags]
    while pieces and (pieces[-1] in ends or (pieces[-1][0] == _TEXT and not pieces[-1][1].strip())):
        pieces.pop()
    content: list[str] = []
    calls: list[ToolCall] = []
    i = 0
    while i < len(pieces):
        kind, text = pieces[i]
        if kind == _TEXT:
            content.append(text)
            i += 1
        elif text == TOOL_CALL_OPEN:
            i = _parse_block(pieces, i, calls, finish_reason)
        elif text == TOOL_RESPONSE_OPEN:
            i = _skip_response(pieces, i, calls)
        else:
            calls.append(ToolCall(f"call_{len(calls)}", "", text, _stray_tag_error(text)))
            i += 1
    message = Message("assistant", "".join(content).strip(), tuple(calls))
    return message, sum(c.error is not None for c in calls)


def _template_dict(message: Message) -> dict[str, Any]:
    """The OpenAI form, except that well-formed arguments stay a dict for the template's tojson
    (so a rendered call is exactly what the model must generate)."""
    d = message.to_openai()
    for call, rendered in zip(message.tool_calls, d.get("tool_calls", ()), strict=True):
        if isinstance(call.arguments, SpelledArguments):  # as the model wrote it, rendered verbatim
            rendered["function"]["arguments"] = call.arguments.json_text
        elif isinstance(call.arguments, dict):
            rendered["function"]["arguments"] = call.arguments
    return d


def _own_template(tokenizer: PreTrainedTokenizerBase) -> str | None:
    own = tokenizer.chat_template
    if isinstance(own, dict):  # several named templates: the one for tools
        own = tokenizer.get_chat_template(tools=[])
    return own or None


# A conversation with everything the harness sends through a template, each part findable by its text.
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe_tool",
            "description": "Probe tool description.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
_PROBE_CALL = ToolCall("call_0", "probe_tool", {"path": "probe/path.py"})
_PROBE = [
    Message("system", "Probe system."),
    Message("user", "Probe request."),
    Message("assistant", "", (_PROBE_CALL,)),
    Message("tool", "Probe result.", tool_call_id="call_0", name="probe_tool"),
]


def _template_problem(
    tokenizer: PreTrainedTokenizerBase, template: str, control_re: re.Pattern | None
) -> tuple[str | None, str]:
    """(Why the harness cannot use this template, or None; the token that ends its assistant turns)."""

    def render(messages: Sequence[Message], tools: list | None, gen: bool) -> str:
        conversation = [_template_dict(m) for m in messages]
        return tokenizer.apply_chat_template(
            conversation, tools=tools, chat_template=template, add_generation_prompt=gen, tokenize=False
        )

    try:
        before = render(_PROBE[1:2], None, True)
        answer = render([*_PROBE[1:2], Message("assistant", "Probe answer.")], None, False)
        prior = render(_PROBE[:3], _PROBE_TOOLS, False)
        full = render(_PROBE, _PROBE_TOOLS, True)
    except Exception as e:  # noqa: BLE001 (a template's raise_exception, or its own bug: any error means unusable)
        return f"fails on a conversation with tools and tool results ({type(e).__name__}: {e})", ""
    tail = answer.partition("Probe answer.")[2]
    end = control_re.search(tail) if control_re else None
    if not answer.startswith(before) or end is None:
        return "does not end an assistant turn with a control token after its generation prompt", ""
    if "Probe tool description." not in full:
        return "does not show the tools to the model", ""
    calls = parse_text(prior.partition("Probe request.")[2])[0].tool_calls  # (its other tags: stray-tag errors)
    if not any((c.name, c.arguments) == (_PROBE_CALL.name, _PROBE_CALL.arguments) for c in calls):
        return "does not write tool calls as the <tool_call> JSON blocks vivace parses", ""
    if "Probe result." not in full:
        return "drops tool results", ""
    cut = prior.rfind(end.group(0))
    if cut < 0 or not full.startswith(prior[: cut + len(end.group(0))]):
        return (
            "is not prefix-stable (it renders an assistant turn differently once more messages follow, as "
            "Qwen3's does with <think>), so rollouts could not extend the tokens sampled so far"
        ), ""
    return None, end.group(0)


def _directory(tokenizer: PreTrainedTokenizerBase) -> str:
    """The directory the tokenizer was loaded from ("" when it was built in memory)."""
    return getattr(tokenizer, "name_or_path", "") or ""


def _template_name(tokenizer: PreTrainedTokenizerBase, template: str, from_tokenizer: bool) -> str:
    if template == QWEN_TEMPLATE:
        return "the chat template vivace.harness.chat.QWEN_TEMPLATE"
    if from_tokenizer:
        return f"the chat template of tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}"
    return "the given chat template"


def _unmark(text: str) -> str:
    return text.replace(_MARK_START, "").replace(_MARK_END, "")


def _split(text: str, tag_re: re.Pattern | None) -> list[tuple[bool, str]]:
    if tag_re is None:
        return [(_TEXT, text)]
    return [(_TAG if i % 2 else _TEXT, part) for i, part in enumerate(tag_re.split(text)) if i % 2 or part]


def _parse_block(pieces: list[tuple[bool, str]], start: int, calls: list[ToolCall], finish_reason: str) -> int:
    """Parses the block opening at pieces[start] into calls; returns the index after it.
    A nested <tool_call> extends the block to its matching close, so it is one error, not several."""
    depth, i, body, problem = 1, start + 1, [], None
    while i < len(pieces) and depth:
        kind, text = pieces[i]
        if kind == _TAG and text == TOOL_CALL_OPEN:
            depth += 1
            problem = problem or "a <tool_call> was opened inside another <tool_call> block"
        elif kind == _TAG and text == TOOL_CALL_CLOSE:
            depth -= 1
        elif kind == _TAG:
            problem = problem or f"{text} is not allowed inside a <tool_call> block"
        if depth:
            body.append(text)
        i += 1
    raw = "".join(body)
    call_id = f"call_{len(calls)}"
    if depth:
        cut_off = "was cut off by the token limit" if finish_reason == "length" else "was never closed"
        problem = f"the <tool_call> block {cut_off} (no </tool_call>)" + (f"; {problem}" if problem else "")
    calls.append(ToolCall(call_id, _recover_name(raw), raw, problem) if problem else _parse_body(call_id, raw))
    return i


def _skip_response(pieces: list[tuple[bool, str]], start: int, calls: list[ToolCall]) -> int:
    """A <tool_response> the model wrote itself, through its </tool_response>: one error."""
    end = next((j for j in range(start + 1, len(pieces)) if pieces[j] == (_TAG, TOOL_RESPONSE_CLOSE)), len(pieces) - 1)
    raw = "".join(text for _, text in pieces[start : end + 1])
    calls.append(ToolCall(f"call_{len(calls)}", "", raw, _stray_tag_error(TOOL_RESPONSE_OPEN)))
    return end + 1


def _parse_body(call_id: str, raw: str) -> ToolCall:
    """One block's JSON: exactly {"name": str, "arguments": object (or a JSON string of one)}."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return ToolCall(call_id, _recover_name(raw), raw, f"the tool call is not valid JSON ({e})")
    if not isinstance(obj, dict):
        return ToolCall(
            call_id,
            "",
            raw,
            f'the tool call must be a JSON object with "name" and "arguments", got {type(obj).__name__}',
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, "", raw, 'the tool call has no "name" string')
    extra = sorted(set(obj) - {"name", "arguments"})
    if "arguments" not in obj or extra:
        got = f" (got {', '.join(map(json.dumps, extra))})" if extra else ""
        return ToolCall(call_id, name, raw, f'the tool call must have exactly the keys "name" and "arguments"{got}')
    decoded = decode_call(call_id, name, obj["arguments"])
    if decoded.error is not None:  # its name as decode_call records it (a lone surrogate escaped)
        return ToolCall(call_id, decoded.name, raw, decoded.error)
    spelled = _member_text(raw, "arguments")
    if spelled is not None and spelled.startswith("{"):  # an object as written (not a JSON string of one)
        return ToolCall(call_id, name, SpelledArguments(decoded.arguments, spelled))
    return decoded


def _member_text(raw: str, key: str) -> str | None:
    """The text of the value of `key` in the JSON object `raw` (valid JSON), the last one when the
    key repeats (as json.loads takes it)."""
    decoder, found = json.JSONDecoder(), None
    at = _JSON_SPACE.match(raw).end() + 1  # past the object's "{"
    while True:
        at = _JSON_SPACE.match(raw, at).end()
        if raw[at] == "}":
            return found
        name, at = decoder.raw_decode(raw, at)
        at = _JSON_SPACE.match(raw, _JSON_SPACE.match(raw, at).end() + 1).end()  # past the ":"
        _, end = decoder.raw_decode(raw, at)
        if name == key:
            found = raw[at:end]
        at = _JSON_SPACE.match(raw, end).end()
        at += raw[at] == ","


def _recover_name(raw: str) -> str:
    m = _NAME.search(raw)
    if not m:
        return ""
    try:
        return str(json.loads(m.group(1)))
    except ValueError:
        return ""


def _stray_tag_error(tag: str) -> str:
    if tag == TOOL_CALL_CLOSE:
        return "a </tool_call> without an opening <tool_call>"
    if tag in (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE):
        return f"the model wrote {tag}; tool results come from the environment, not the model"
    return f"unexpected {tag} inside the assistant's turn"
