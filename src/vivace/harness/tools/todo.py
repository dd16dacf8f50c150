"""todo_write: the agent's task list, kept in the episode's ToolContext.

The list helps a model plan multi-step work and lets logs and UIs show progress. It is
plain state: nothing in the workspace changes. Every call answers with the whole list, so
the model always sees the current state rather than a diff of it.

The list is capped (MAX_TODOS items of at most MAX_TODO_CHARS characters): every call stores the whole
list in the result's meta, so an unbounded list made trajectories grow with the square of the calls
(5,000 items answered with 5 MB). The rendered list is truncated like every other result.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from vivace.harness.tools.base import Access, ToolArgs, ToolContext, ToolResult, truncate
from vivace.harness.tools.files import error

Status = Literal["pending", "in_progress", "completed", "cancelled"]
MARKS = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]", "cancelled": "[-]"}
MAX_TODOS = 100  # items in the list
MAX_TODO_CHARS = 500  # characters of one item's content
TODOS = "<todos>"  # a pseudo path: two todo_writes in one turn conflict, so they keep their order


def _at_most(value: str, limit: int, what: str) -> str:
    if len(value) > limit:
        raise ValueError(f"{what} may hold at most {limit} characters, got {len(value)}")
    return value


class TodoItem(ToolArgs):
    id: str = Field(description="Stable identifier of the item, e.g. '1' or 'fix-parser'.")
    content: str = Field("", description="What to do (required for a new item; empty keeps the old text on merge).")
    status: Status | None = Field(
        None, description="pending, in_progress, completed or cancelled (default: pending, or unchanged on merge)."
    )

    # Limits by validators, not Field constraints, which would change the tool's schema in the system prompt.
    @field_validator("id")
    @classmethod
    def _short_id(cls, value: str) -> str:
        return _at_most(value, 100, "an id")

    @field_validator("content")
    @classmethod
    def _short_content(cls, value: str) -> str:
        return _at_most(value, MAX_TODO_CHARS, "an item's content")


class TodoWriteArgs(ToolArgs):
    todos: list[TodoItem] = Field(description="The items to write.")

    @field_validator("todos", mode="before")  # before each item is checked: 5,000 bad items, one error
    @classmethod
    def _few(cls, todos: Any) -> Any:
        if isinstance(todos, list) and len(todos) > MAX_TODOS:
            raise ValueError(f"{len(todos)} items, over the limit of {MAX_TODOS}: keep one item per step of the task")
        return todos

    merge: bool = Field(
        False, description="True: update the items with these ids and append new ones; False: replace the whole list."
    )


class TodoWrite:
    name: ClassVar[str] = "todo_write"
    description: ClassVar[str] = (
        "Create or update your task list for this task. merge=false replaces the list; merge=true updates "
        "items by id (content, status) and appends new ones. Returns the whole list, one item per line "
        "(`[ ]` pending, `[>]` in progress, `[x]` completed, `[-]` cancelled), with counts."
    )
    Args: ClassVar[type[ToolArgs]] = TodoWriteArgs

    def access(self, args: TodoWriteArgs) -> Access:
        return Access(writes=frozenset({TODOS}))

    async def run(self, args: TodoWriteArgs, ctx: ToolContext) -> ToolResult:
        ids = [t.id for t in args.todos]
        if len(set(ids)) != len(ids):
            return error("todo ids must be unique within one call; nothing was changed.")
        current = {t["id"]: dict(t) for t in ctx.todos} if args.merge else {}
        for item in args.todos:
            if not item.id.strip():
                return error("every todo needs a non-empty id; nothing was changed.")
            old = current.get(item.id)
            if old is None and not item.content.strip():
                return error(f"new todo {item.id!r} has no content; nothing was changed.")
            content = item.content if item.content.strip() else old["content"]  # type: ignore[index]
            status = item.status or (old["status"] if old else "pending")
            current[item.id] = {"id": item.id, "content": content, "status": status}
        if len(current) > MAX_TODOS:
            return error(
                f"the todo list would hold {len(current)} items, over the limit of {MAX_TODOS}; nothing was changed. "
                "Keep one item per step of the task: group small steps, or replace the list (merge=false) "
                "without finished items."
            )
        ctx.todos[:] = list(current.values())  # in place: whoever holds the list sees the update
        text = truncate(render(ctx.todos), ctx.max_result_chars, hint="keep the list shorter")
        return ToolResult(text, meta={"todos": [dict(t) for t in ctx.todos]})


def render(todos: list[dict[str, str]]) -> str:
    if not todos:
        return "Todo list is empty."
    lines = [f"{MARKS.get(t['status'], '[ ]')} {t['id']}: {t['content']}" for t in todos]
    counts = {s: sum(t["status"] == s for t in todos) for s in MARKS}
    summary = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items() if n)
    return "\n".join(lines) + f"\n({len(todos)} items: {summary})"
