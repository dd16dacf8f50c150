"""todo_write: the agent's task list, kept in the episode's ToolContext.

The list helps a model plan multi-step work and lets logs and UIs show progress. It is
plain state: nothing in the workspace changes. Every call answers with the whole list, so
the model always sees the current state rather than a diff of it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from vivace.harness.tools.base import Access, ToolArgs, ToolContext, ToolResult
from vivace.harness.tools.files import error

Status = Literal["pending", "in_progress", "completed", "cancelled"]
MARKS = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]", "cancelled": "[-]"}
TODOS = "<todos>"  # a pseudo path: two todo_writes in one turn conflict, so they keep their order


class TodoItem(ToolArgs):
    id: str = Field(description="Stable identifier of the item, e.g. '1' or 'fix-parser'.")
    content: str = Field("", description="What to do (required for a new item; empty keeps the old text on merge).")
    status: Status | None = Field(
        None, description="pending, in_progress, completed or cancelled (default: pending, or unchanged on merge)."
    )


class TodoWriteArgs(ToolArgs):
    todos: list[TodoItem] = Field(description="The items to write.")
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
        ctx.todos[:] = list(current.values())  # in place: whoever holds the list sees the update
        return ToolResult(render(ctx.todos), meta={"todos": [dict(t) for t in ctx.todos]})


def render(todos: list[dict[str, str]]) -> str:
    if not todos:
        return "Todo list is empty."
    lines = [f"{MARKS.get(t['status'], '[ ]')} {t['id']}: {t['content']}" for t in todos]
    counts = {s: sum(t["status"] == s for t in todos) for s in MARKS}
    summary = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items() if n)
    return "\n".join(lines) + f"\n({len(todos)} items: {summary})"
