"""Chat-API parity: does a token-level episode reach the model as the same tokens when it goes through
`vivace serve`'s chat API instead? For each saved trajectory of a token-level policy (`vivace bench
--model tiny`, whose trajectories keep their token log), each sampled turn is sent through the server's
reply (the text parsed into content and tool_calls), read back by OpenAIPolicy, sent again as the
client's messages and rendered by the server; the prompt it renders is compared with the tokens the
episode held before its next turn. In process: no server, no model.

    .venv/bin/python scripts/api_roundtrip.py RUN/trajectories/tiny [--json]

Prints, per trajectory, OK or the first turn and token where the two part (docs/benchmarks.md,
"Chat API parity").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vivace.harness.chat import ChatFormat
from vivace.harness.messages import Message, messages_from_openai
from vivace.harness.policies import _completion_turn, _for_api
from vivace.harness.policy import Completion
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.inference.replies import Output, Shape, reply
from vivace.model.checkpoint import load_tokenizer
from vivace.rl.rollout import _runs  # the sampled turns' [start, end) in the token log


def first_parting(chat: ChatFormat, trajectory: dict, tools: list[dict]) -> str | None:
    """None when every turn's prompt over the chat API equals the episode's tokens, else where it parts."""
    ids, spans = trajectory["tokens"]["ids"], _runs(trajectory["tokens"]["loss_mask"])
    conversation = [Message("system", trajectory["system_prompt"]), Message("user", trajectory["request"])]
    if chat.prompt_ids(conversation, tools) != ids[: spans[0][0]]:
        return "turn 0: the first prompt differs"
    for k, (a, b) in enumerate(spans[:-1]):
        turn = trajectory["turns"][k]
        out = Output(Completion(ids[a:b], [0.0] * (b - a), turn["finish_reason"], 0), [])
        message, finish = reply(chat, out, Shape(True, True))
        read = _completion_turn({"choices": [{"message": message, "finish_reason": finish}]}, "api", True).message
        if not read.tool_calls:
            return None  # the answer: no further prompt to compare
        conversation.append(Message("assistant", read.content, read.tool_calls))
        for call, record in zip(read.tool_calls, turn["tool_calls"], strict=False):
            conversation.append(Message("tool", record["result"], tool_call_id=call.id, name=call.name))
        wire = json.loads(json.dumps([_for_api(m) for m in conversation]))
        api, want = chat.prompt_ids(messages_from_openai(wire), tools), ids[: spans[k + 1][0]]
        if api != want:
            i = next((j for j, (x, y) in enumerate(zip(api, want, strict=False)) if x != y), min(len(api), len(want)))
            return (f"turn {k + 1}, token {i}: over the API {chat.decode(api[i - 20 : i + 20])!r}, "
                    f"in the episode {chat.decode(want[i - 20 : i + 20])!r}")  # fmt: skip
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trajectories", type=Path, help="A directory of a token-level policy's trajectories.")
    parser.add_argument("--json", action="store_true", help="Print the counts as JSON.")
    args = parser.parse_args()
    chat = ChatFormat(load_tokenizer("tiny"))
    tools = [tool_schema(t) for t in default_tools()]
    files = sorted(args.trajectories.glob("*.json"))
    parted = {}
    for path in files:
        if (where := first_parting(chat, json.loads(path.read_text()), tools)) is not None:
            parted[path.name] = where
        if not args.json:
            print(path.name, "OK" if where is None else where)
    same = len(files) - len(parted)
    print(json.dumps({"trajectories": len(files), "same": same, "parted": parted}, indent=1) if args.json
          else f"{same}/{len(files)} reach the model as the same tokens over the chat API")  # fmt: skip


if __name__ == "__main__":
    main()
