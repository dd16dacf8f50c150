"""SearchConfig: how the semantic index is built and queried (the tool's backend, the CLI)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vivace.config import cache_root
from vivace.search.embed import DEFAULT_MODEL


def default_cache_dir() -> Path:
    """$VIVACE_SEARCH_CACHE, else the search folder beside vivace's other caches (~/.cache/vivace/search)."""
    env = os.environ.get("VIVACE_SEARCH_CACHE")
    return Path(env) if env else cache_root() / "search"


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str = Field(
        DEFAULT_MODEL,
        description="Embedding model: the packaged default, or a local sentence-transformers model directory.",
    )
    mode: Literal["hybrid", "bm25", "dense"] = Field("hybrid", description="Retrieval used by codebase_search.")
    cache_dir: Path | None = Field(
        default_factory=default_cache_dir,
        description="Where embeddings (by content hash) and base indexes (by Merkle root) persist; None: memory only.",
    )
    max_files: int = Field(50_000, ge=1, description="Files indexed per tree at most (the rest are not searched).")
    max_file_bytes: int = Field(500_000, ge=1, description="Larger files are not indexed (generated data, bundles).")
    share_threshold: float = Field(
        0.9,
        ge=0,
        le=1,
        description="A tree not indexed yet reuses a base holding at least this fraction of its files (plus an "
        "overlay of the rest); below it, the tree gets its own base (only new chunks are embedded).",
    )
    bases_in_memory: int = Field(8, ge=1, description="Base indexes kept in memory (least recently used dropped).")
