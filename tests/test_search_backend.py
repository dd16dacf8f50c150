"""The semantic index with the real embedding model, through real workspaces (plain backend):
one base shared by 100 workspaces, edits searchable at once, the codebase_search tool's text,
odd trees (binary, unreadable, empty), a tiny sandbox output cap, and mining fine-tuning pairs.

The model is loaded once per session; every test gets a fresh in-memory cache over it, so
counts of embedded texts are exact.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from conftest import make_backend
from vivace.harness.tools import default_tools, tools_by_name
from vivace.harness.tools.base import ToolContext, parse_args
from vivace.search import tree as tree_mod
from vivace.search.backend import HybridSearch
from vivace.search.config import SearchConfig
from vivace.search.embed import Embedder, EmbeddingCache

FILES = {
    "shop/pricing.py": "def compute_total_price(items, tax_rate):\n    subtotal = sum(i.price for i in items)\n"
    "    return subtotal * (1 + tax_rate)\n",
    "shop/cart.py": "class Cart:\n    def add_item(self, item):\n        self.items.append(item)\n",
    "geo/distance.py": "import math\n\n\ndef haversine(lat1, lon1, lat2, lon2):\n    '''Great-circle distance in km.'''\n"
    "    return 6371 * 2 * math.asin(math.sqrt(lat1 + lon1 + lat2 + lon2))\n",
    "web/app.ts": "export function renderLoginPage(user: string): string {\n  return `<h1>Welcome ${user}</h1>`;\n}\n",
    "README.md": "# shop\nA small shop.\n",
}


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture
def search(embedder) -> HybridSearch:
    return HybridSearch(SearchConfig(cache_dir=None), EmbeddingCache(embedder))


@pytest.fixture
def shop(tmp_path) -> Path:
    root = tmp_path / "shop"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
async def backend(state_dir):
    b = make_backend("plain", state_dir)
    yield b
    await b.aclose()


async def test_hundred_workspaces_embed_the_base_once(search, shop, backend):
    snap = backend.snapshot(str(shop))
    workspaces = await asyncio.gather(*(backend.create(snap) for _ in range(100)))
    cache = search.indexer.cache
    start = cache.embedder.encoded
    results = await asyncio.gather(*(search.search(ws, "distance between two points", None, 3) for ws in workspaces))
    assert all(r[0].path == "geo/distance.py" for r in results)
    states = [search._indexes.get_for(ws) for ws in workspaces]
    base = states[0].view.base
    assert all(s.view.base is base for s in states) and search.indexer.store.builds == 1
    assert len(cache) == len(base.chunks) == cache.embedder.encoded - start - 1  # the chunks once, plus one query
    # an edit in one workspace: only its changed chunk is embedded, and only that workspace sees it
    before = cache.embedder.encoded
    await workspaces[7].write_text(
        "shop/cart.py", FILES["shop/cart.py"] + "\n\ndef apply_coupon_code(cart, code):\n    return cart\n"
    )
    hits = await search.search(workspaces[7], "apply coupon code", None, 3)
    assert hits[0].path == "shop/cart.py" and hits[0].symbol in ("Cart", "apply_coupon_code")
    assert cache.embedder.encoded - before == 2  # one chunk, one query
    assert "apply_coupon_code" not in (await search.search(workspaces[8], "apply coupon code", None, 3))[0].snippet
    for ws in workspaces:
        await ws.close()


async def test_codebase_search_tool_text(search, shop, backend):
    tool = tools_by_name(default_tools(search))["codebase_search"]
    ctx = ToolContext(workspace=await backend.create(backend.snapshot(str(shop))))

    async def run(**args) -> str:
        result = await tool.run(parse_args(tool, args), ctx)
        assert not result.is_error, result.text
        return result.text

    text = await run(query="computeTotalPrice tax")
    assert text.startswith(
        "shop/pricing.py:1-3 (compute_total_price)\n     1\tdef compute_total_price(items, tax_rate):"
    )
    assert "login page" not in text and (await run(query="welcome page after login")).startswith("web/app.ts:1-3")
    assert await run(query="zebra giraffe") == "No results for 'zebra giraffe'."
    await ctx.workspace.write_text("zoo/zebra.py", "def feed_zebra_and_giraffe():\n    return 'hay'\n")
    assert (await run(query="zebra giraffe")).startswith("zoo/zebra.py:1-2 (feed_zebra_and_giraffe)")
    assert "shop/" not in await run(query="compute total price", target_directories=["geo", "/workspace/web"])
    assert (
        await run(query="compute total price", target_directories=["../outside"])
        == "No results for 'compute total price'."
    )
    await ctx.workspace.remove("zoo/zebra.py")
    assert await run(query="zebra giraffe") == "No results for 'zebra giraffe'."
    for query in ("", "  \n"):  # refused as arguments, before any search (and by the backend itself)
        result = parse_args(tool, {"query": query})
        assert result.is_error and "the query is empty" in result.text
        with pytest.raises(ValueError, match="the query is empty"):
            await search.search(ctx.workspace, query, None, 5)


async def test_file_name_not_utf8_is_indexed_under_its_real_name(search, shop):
    name = os.fsdecode(b"caf\xe9_menu.py")  # undecodable byte kept as a surrogate (surrogateescape)
    (shop / name).write_text("def list_coffee_menu_items():\n    return ['espresso', 'latte']\n")
    state = await search.indexer.open(tree_mod.DirectorySource(shop, search.config))
    hits = state.view.search("coffee menu items", 3, "dense")
    assert hits[0].path == name and (shop / hits[0].path).is_file()


async def test_odd_trees(search, backend, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    ws = await backend.create(backend.snapshot(str(empty)))
    assert await search.search(ws, "anything at all", None, 5) == []
    await ws.write_bytes("blob.bin", b"\x00\x01" * 1000)
    await ws.write_text("big.txt", "word " * 200_000)  # over max_file_bytes
    await ws.write_text("src/ok.py", "def parse_invoice_number(text):\n    return int(text)\n")
    await ws.exec("mkdir -p locked && echo 'def secret(): pass' > locked/s.py && chmod 000 locked/s.py")
    hits = await search.search(ws, "parse invoice number", None, 5)
    assert [h.path for h in hits] == ["src/ok.py"]


async def test_tiny_output_cap_pages_and_batches(embedder, shop, state_dir, monkeypatch):
    from vivace.config import SandboxConfig
    from vivace.sandbox.plain import PlainBackend

    for i in range(40):
        (shop / f"gen/m{i}.py").parent.mkdir(exist_ok=True)
        (shop / f"gen/m{i}.py").write_text(
            "".join(f"def func_{i}_{j}(x):\n    return x + {j}\n\n\n" for j in range(30))
        )
    monkeypatch.setattr(tree_mod, "PAGE", 16)
    small = PlainBackend(SandboxConfig(backend="plain", state_dir=state_dir, output_limit_bytes=4096))
    try:
        search = HybridSearch(SearchConfig(cache_dir=None), EmbeddingCache(embedder))
        ws = await small.create(small.snapshot(str(shop)))
        hits = await search.search(ws, "func_37_5", None, 3)
        assert hits[0].path == "gen/m37.py"
        full = HybridSearch(SearchConfig(cache_dir=None), search.indexer.cache)
        reference = await full.indexer.open(tree_mod.DirectorySource(shop, full.config))
        assert search._indexes.get_for(ws).view.root == reference.view.root
    finally:
        await small.aclose()


async def test_default_backend_is_hybrid_and_shares_bases(shop, backend, monkeypatch, tmp_path):
    import vivace.search.backend as backend_mod

    monkeypatch.setenv("VIVACE_SEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(backend_mod, "_default", None)
    tool = tools_by_name(default_tools())["codebase_search"]
    contexts = [ToolContext(workspace=await backend.create(backend.snapshot(str(shop)))) for _ in range(2)]
    for ctx in contexts:
        assert not (await tool.run(parse_args(tool, {"query": "shopping cart"}), ctx)).is_error
    assert contexts[0].search is contexts[1].search is backend_mod.default_backend()
    assert isinstance(contexts[0].search, HybridSearch) and contexts[0].search.indexer.store.builds == 1
    assert list((tmp_path / "cache" / "bases").iterdir())  # the base persists for other processes


def test_mining_pairs_from_a_trajectory(tmp_path):
    from vivace.harness.trajectory import ToolRecord, Trajectory, Turn
    from vivace.search.finetune import mine_episodes
    from vivace.tasks.suites import load_suite

    task = load_suite("bugs")[0]
    turns = [
        Turn(
            content="",
            tool_calls=[ToolRecord(id="1", name="codebase_search", arguments={"query": "percent split"}, result="")],
        ),
        Turn(
            content="",
            tool_calls=[ToolRecord(id="2", name="read_file", arguments={"path": "ledger/errors.py"}, result="")],
        ),
    ]
    traj = Trajectory(task_id=task.id, request=task.request, policy="scripted:oracle", system_prompt="",
                      system_prompt_version="1", turns=turns, diff=task.reference_patch, stop_reason="done")  # fmt: skip
    run = tmp_path / "run"
    (run / "trajectories" / "oracle").mkdir(parents=True)
    traj.save(run / "trajectories" / "oracle" / f"{task.id}.json")
    (run / "results.jsonl").write_text(
        f'{{"task_id": "{task.id}", "resolved": true, "trajectory": "trajectories/oracle/{task.id}.json"}}\n'
        f'{{"task_id": "x", "resolved": false, "trajectory": "trajectories/oracle/x.json"}}\n'
    )
    episodes, skipped = mine_episodes(run, tmp_path / "state")
    assert len(episodes) == 1 and skipped == {"unknown_task": 0, "unreadable": 0, "no_relevant_chunk": 0}
    ep = episodes[0]
    assert ep.queries == [task.request, "percent split"]
    edited = {ep.chunks[i].path for i in ep.relevant[task.request]}
    assert edited >= {"ledger/splits.py"} and {ep.chunks[i].path for i in ep.relevant["percent split"]} >= edited
    line = task.metadata["line"]
    assert any(ep.chunks[i].start <= line <= ep.chunks[i].end for i in ep.relevant[task.request])
