"""What every tool shares: the Tool protocol, results, the context, argument checking, and
the one truncation rule.

A tool declares its arguments as a pydantic model: the JSON schema the model sees is
generated from it, and a model's malformed arguments become an error the model can read
(never an exception that ends the episode). Tool results are plain text: stable, concise,
and truncated by `truncate` alone so that every tool says the same thing when it cuts.

Not covered here: running several calls together (executor.py) and rendering to tokens
(the chat format).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol, runtime_checkable

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from vivace.sandbox.base import Workspace
from vivace.sandbox.paths import WORKSPACE_MOUNT

MAX_RESULT_CHARS = 20_000  # what one tool result may put in front of the model (less for a small context)
MAX_RESULT_LINES = 500
EVERYTHING = "*"  # a resource name that overlaps every other (shell commands, repo-wide search)


class ToolArgs(BaseModel):
    """Base of every tool's arguments: unknown arguments are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model sees
    is_error: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # for logs, scorers and UIs; never shown


@dataclass(frozen=True)
class Access:
    """Workspace paths a call reads and writes (EVERYTHING for the whole tree); calls whose
    accesses conflict run in call order, all others run at the same time."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()

    def conflicts(self, other: Access) -> bool:
        return _overlap(self.writes, other.writes | other.reads) or _overlap(other.writes, self.reads)


def _overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether two sets of paths touch: the same path, one inside the other, or EVERYTHING."""
    if not a or not b:
        return False
    if EVERYTHING in a or EVERYTHING in b:
        return True
    return any(_nested(x, y) for x in a for y in b)


def _nested(x: str, y: str) -> bool:
    x, y = norm_path(x), norm_path(y)
    return x == y or x == "." or y == "." or y.startswith(x + "/") or x.startswith(y + "/")


def norm_path(path: str) -> str:
    """A workspace-relative path in one lexical spelling ("." for the root; `/workspace/x` is
    `x`, as the workspace reads it), for comparing accesses. Symlinks are resolved by the
    executor; the workspace itself resolves and confines paths."""
    path = path.strip()
    if path == WORKSPACE_MOUNT or path.startswith(WORKSPACE_MOUNT + "/"):
        path = path[len(WORKSPACE_MOUNT) :]
    return posixpath.normpath(path.lstrip("/") or ".")


# A file name's bytes that are not UTF-8 reach Python as lone surrogates (os.fsdecode's
# surrogateescape). No tokenizer or JSON body can encode those, so a single such name ended the
# episode; results show each such byte as `\xNN`, and path arguments take that spelling back.
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN_BYTE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def shown(text: str) -> str:
    r"""`text` as valid Unicode: an undecodable file-name byte as `\xNN`, any other lone surrogate
    as `\uNNNN`."""
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(_escape_surrogate, text)


def _escape_surrogate(m: re.Match[str]) -> str:
    code = ord(m[0])
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def from_shown(path: str) -> str:
    r"""A path as `shown` spells it, back to the name on disk: `\xNN` (80-ff) is that byte."""
    return _SHOWN_BYTE.sub(lambda m: chr(0xDC00 + int(m[1], 16)), path) if "\\x" in path else path


# A path argument: accepts the `\xNN` spelling results use for a name that is not UTF-8.
WorkspacePath = Annotated[str, AfterValidator(from_shown)]


@dataclass
class ToolContext:
    """What tools act on. One per episode; tools may keep per-episode state here."""

    workspace: Workspace
    todos: list[dict[str, str]] = field(default_factory=list)  # todo_write's list
    search: Any = None  # the codebase_search backend (see search.py); None: built on first use
    command_timeout_s: float = 120.0  # default for run_terminal_cmd
    reproducible_output: bool = False  # AgentConfig.reproducible_output, for run_terminal_cmd
    max_result_chars: int = MAX_RESULT_CHARS  # one result's budget (agent.result_budget)


@runtime_checkable
class Tool(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]  # one paragraph shown to the model
    Args: ClassVar[type[ToolArgs]]

    def access(self, args: ToolArgs) -> Access:
        """Which paths the call reads and writes (decides what may run in parallel)."""
        ...

    async def run(self, args: ToolArgs, ctx: ToolContext) -> ToolResult: ...


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI-style function schema of a tool (what chat templates render)."""
    params = tool.Args.model_json_schema()
    params.pop("title", None)
    for prop in params.get("properties", {}).values():
        prop.pop("title", None)
    params["additionalProperties"] = False
    return {"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": params}}


def parse_args(tool: Tool, raw: Any) -> ToolArgs | ToolResult:
    """Validated arguments, or an error result that tells the model what to fix."""
    if not isinstance(raw, dict):
        return ToolResult(f"Error: arguments for {tool.name} must be a JSON object, got {type(raw).__name__}.", True)
    try:
        return tool.Args.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "arguments"
            problems.append(f"{where}: {err['msg']}")
        return ToolResult(f"Error: invalid arguments for {tool.name}: " + "; ".join(problems) + ".", True)


def truncate(text: str, max_chars: int = MAX_RESULT_CHARS, max_lines: int = MAX_RESULT_LINES, hint: str = "") -> str:
    """The one truncation rule: keep the first 2/3 and the last 1/3 of the budget (in lines
    and in characters) and say how much was cut; `hint` says how to see the rest."""
    # Lines end at \n only, as read_file and grep count them (splitlines also breaks at form feeds and
    # U+2028: a 300-line file holding them was cut at 250 lines, one line cut in the middle).
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    if len(text) <= max_chars and len(lines) <= max_lines:
        return text
    if len(lines) > max_lines:
        head, tail = "".join(lines[: max_lines * 2 // 3]), "".join(lines[len(lines) - max_lines // 3 :])
    else:
        head, tail = text, text
    head, tail = head[: max_chars * 2 // 3], tail[len(tail) - max_chars // 3 :]
    omitted = len(text) - len(head) - len(tail)
    note = f"[... {omitted} characters omitted; the full output had {len(lines)} lines, {len(text)} characters"
    note += f"; {hint}" if hint else ""
    sep = "" if head.endswith("\n") else "\n"
    return f"{head}{sep}{note} ...]\n{tail}"
