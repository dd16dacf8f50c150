"""The semantic index's parts, fast: chunking (six languages, malformed and odd files), the
scan's file rules, Merkle diffs against brute force, BM25 of overlay documents against bm25s,
and the incremental view against a full rebuild after random edits.

A deterministic bag-of-words embedder stands in for the model here (the mechanics do not
depend on it); test_search_backend.py uses the real one.
"""

from __future__ import annotations

import os
import random
import zlib

import numpy as np
import pytest

from vivace.search import scan
from vivace.search.chunking import MAX_CHARS, MAX_SYMBOLS, chunk_file
from vivace.search.embed import EmbeddingCache
from vivace.search.index import BaseIndex
from vivace.search.lexical import LexicalIndex, tokenize
from vivace.search.merkle import MerkleTree
from vivace.search.view import IndexView


class FakeEmbedder:
    """Hashing-trick bag of words, L2-normalised: similar words, similar vectors; no model."""

    id, batch_size, dim = "fake", 32, 64

    def __init__(self) -> None:
        self.calls = self.encoded = 0

    def encode(self, texts):
        self.calls += 1
        self.encoded += len(texts)
        return self._vectors(texts)

    def _vectors(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            for tok in tokenize(text):
                out[i, zlib.crc32(tok.encode()) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_query(self, query):
        return self._vectors([query])[0]


def check_cover(chunks, text):
    n = len(text.split("\n")) - text.endswith("\n")
    assert chunks[0].start == 1 and chunks[-1].end == n
    assert all(a.end + 1 == b.start for a, b in zip(chunks, chunks[1:], strict=False))


SOURCES = {
    "a.py": "import os\n\n\nclass Cart:\n    def add(self, item):\n        self.items.append(item)\n\n\n"
    "@decorator\ndef total(items, tax):\n    return sum(items) * (1 + tax)\n",
    "b.ts": "export interface Item { price: number }\nexport class Cart {\n  add(i: Item) { this.items.push(i); }\n}\n"
    "export const total = (xs: Item[]) => xs.length;\n",
    "c.js": "function parseDate(s) {\n  return new Date(s);\n}\nclass Clock { now() { return 1; } }\n",
    "d.go": "package shop\n\ntype Cart struct{ Items []int }\n\nfunc (c *Cart) Total() int { return len(c.Items) }\n",
    "e.rs": "pub struct Cart { items: Vec<u32> }\nimpl Cart {\n    pub fn total(&self) -> u32 { 0 }\n}\n",
    "F.java": "package shop;\npublic class Cart {\n    public int total() { return 0; }\n}\n",
}


@pytest.mark.parametrize("path", sorted(SOURCES))
def test_chunks_name_definitions_in_six_languages(path):
    chunks = chunk_file(path, SOURCES[path])
    check_cover(chunks, SOURCES[path])
    names = {s for c in chunks for s in c.symbols}
    assert {"parseDate", "Clock"} <= names if path == "c.js" else "Cart" in names, names


def test_large_definitions_split_into_members_and_small_ones_merge():
    methods = "".join(
        f"    def method_{i}(self, x):\n" + "        x = x + 1\n" * 12 + "        return x\n\n" for i in range(8)
    )
    text = (
        "import os\nimport sys\n\n\nclass Big:\n    '''Doc.'''\n\n"
        + methods
        + "def small_a():\n    pass\n\n\ndef small_b():\n    pass\n"
    )
    chunks = chunk_file("m.py", text)
    check_cover(chunks, text)
    assert all(len(c.text) <= MAX_CHARS * 1.5 for c in chunks)
    assert chunks[0].symbols[0] == "Big" and chunks[0].start == 1  # header (imports, class line) joins the first piece
    assert any("Big.method_7" in c.symbols for c in chunks)
    assert chunks[-1].symbols[-2:] == ("small_a", "small_b")  # small siblings merged


def test_odd_files_still_chunk():
    for path, text in [
        ("broken.py", "def broken(:\n  x = \n\nclass Ok:\n    pass\n"),  # tree-sitter recovers
        ("notes.txt", "\n".join(f"line {i}" for i in range(100))),  # no grammar: line windows
        ("run.sh", "#!/bin/sh\nfunction deploy {\n  echo hi\n}\n"),
        ("min.js", "var a=" + "1+" * 5000 + "1;"),  # one huge line
        ("empty.py", ""),
    ]:
        chunks = chunk_file(path, text)
        if text:
            check_cover(chunks, text)
        else:
            assert chunks == []
    assert chunk_file("run.sh", "function deploy {\n  echo hi\n}\n")[0].symbols == ("deploy",)
    assert max(len(c.text) for c in chunk_file("min.js", "var a=" + "1+" * 20000 + "1;")) <= 20_000


def test_scan_file_rules(tmp_path):
    files = {"src/app.py": "print(1)\n", ".hidden/x.py": "x\n", "node_modules/m.js": "m\n", "big.txt": "x" * 2000}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")
    os.symlink("src/app.py", tmp_path / "link.py")
    (tmp_path / "locked.py").write_text("secret\n")
    (tmp_path / "locked.py").chmod(0)
    got = scan.scan(str(tmp_path), hashes=True, max_bytes=1000)
    listed = {p: h for p, _, _, h in got["files"]}
    assert set(listed) == {"big.txt", "blob.bin", "locked.py", "src/app.py"}
    assert listed["src/app.py"] == scan.text_hash("print(1)\n") and listed["big.txt"] == listed["blob.bin"] == ""
    assert (listed["locked.py"] == "") == (os.geteuid() != 0)  # root reads anything
    assert scan.scan(str(tmp_path / "src"), since_ns=0)["texts"] == {"app.py": "print(1)\n"}
    assert scan.decode(scan.encode(got)) == got
    empty = tmp_path / "empty"
    empty.mkdir()
    assert scan.scan(str(empty), hashes=True)["files"] == []


def test_merkle_diff_matches_brute_force():
    rng = random.Random(0)
    paths = [f"d{rng.randint(0, 5)}/s{rng.randint(0, 3)}/f{i}.py" for i in range(300)] + ["top.py"]
    a = {p: f"h{rng.randint(0, 9)}" for p in paths}
    tree = MerkleTree(a)
    for _ in range(20):
        b = dict(a)
        for p in rng.sample(paths, rng.randint(0, 5)):
            if rng.random() < 0.3:
                b.pop(p, None)
            else:
                b[p] = f"h{rng.randint(10, 19)}"
        b[f"new/{rng.randint(0, 3)}.py"] = "hn"
        other = MerkleTree(b)
        expected = {p: b.get(p) for p in set(a) | set(b) if a.get(p) != b.get(p)}
        assert tree.diff(other) == expected
        incremental = MerkleTree(a)
        for p, h in expected.items():
            incremental.set(p, h)
        assert incremental.root == other.root and incremental.files == other.files
    assert MerkleTree(a).root == tree.root and MerkleTree({}).diff(MerkleTree({})) == {}


def test_overlay_bm25_matches_bm25s():
    rng = random.Random(1)
    words = "alpha beta gamma delta parse total cart price tax".split()
    docs = [[rng.choice(words) for _ in range(rng.randint(1, 30))] for _ in range(60)]
    index = LexicalIndex(docs)
    for query in (["alpha"], ["tax", "tax", "price"], ["unknown", "cart"]):
        assert np.allclose(index.scores(query), index.score_docs(query, docs), atol=1e-5)
    assert tokenize("computeTotalPrice tax_rate") == [
        "computetotalprice",
        "compute",
        "total",
        "price",
        "tax_rate",
        "tax",
        "rate",
    ]


def _repo(rng: random.Random, n: int) -> dict[str, str]:
    words = "parse total cart price tax order stock route fare ledger money split".split()
    out = {}
    for i in range(n):
        funcs = [
            f"def {rng.choice(words)}_{rng.choice(words)}_{j}(x):\n    return x  # {rng.choice(words)}\n\n\n"
            for j in range(rng.randint(1, 40))
        ]
        out[f"pkg{i % 3}/m{i}.py"] = "".join(funcs)
    return out


def test_incremental_view_equals_full_rebuild():
    rng = random.Random(2)
    texts = _repo(rng, 30)
    cache = EmbeddingCache(FakeEmbedder())
    base = BaseIndex.build(texts, cache)
    view = IndexView(base, cache)
    current = dict(texts)
    for step in range(12):
        changes = {}
        for path in rng.sample(sorted(set(current) | {"pkg0/new.py"}), 3):
            roll = rng.random()
            if roll < 0.2:
                changes[path] = None
            elif roll < 0.4 and path in texts:
                changes[path] = texts[path]  # back to the base content
            else:
                changes[path] = (current.get(path) or "") + f"def added_{step}(y):\n    return y\n"
        view.apply(changes)
        for path, text in changes.items():
            current.pop(path, None) if text is None else current.__setitem__(path, text)
        full = IndexView(BaseIndex.build(current, cache), cache)
        key = lambda c: (c.path, c.start, c.end, c.text)  # noqa: E731
        assert sorted(map(key, view.chunks())) == sorted(map(key, full.chunks()))
        assert view.root == full.root == MerkleTree({p: scan.text_hash(t) for p, t in current.items()}).root
        for query in ("total price", f"added {step}"):
            dense = [(h.path, h.start_line, round(h.score, 5)) for h in view.search(query, 10, "dense")]
            assert dense == [(h.path, h.start_line, round(h.score, 5)) for h in full.search(query, 10, "dense")]
            assert {h.path for h in view.search(query, 5, "bm25")} <= set(current)
    assert len(cache) == cache.embedder.encoded  # every distinct chunk text embedded exactly once


def test_search_modes_filters_and_errors():
    texts = {
        "shop/pricing.py": "def compute_total_price(items, tax_rate):\n    return 1\n",
        "pkg/calc.py": "def add(a, b):\n    return a + b\n",
    }
    view = IndexView(BaseIndex.build(texts, EmbeddingCache(FakeEmbedder())), EmbeddingCache(FakeEmbedder()))
    for mode in ("bm25", "dense", "hybrid"):
        hits = view.search("computeTotalPrice tax", 5, mode)
        assert hits[0].path == "shop/pricing.py" and hits[0].symbol == "compute_total_price"
        assert all(h.path.startswith("pkg/") for h in view.search("compute total", 5, mode, ["pkg"]))
    assert view.search("zebra giraffe", 5, "bm25") == []
    with pytest.raises(ValueError, match="unknown search mode"):
        view.search("x", 5, "fuzzy")  # type: ignore[arg-type]
    lexical_only = IndexView(BaseIndex.build(texts, None), None)
    assert lexical_only.search("compute total", 5, "hybrid")[0].path == "shop/pricing.py"
    with pytest.raises(ValueError, match="needs an embedding model"):
        lexical_only.search("x", 5, "dense")
    empty = IndexView(BaseIndex.build({}, None), None)
    assert empty.search("anything", 5, "bm25") == []


def test_base_saves_and_loads(tmp_path):
    cache = EmbeddingCache(FakeEmbedder())
    base = BaseIndex.build(_repo(random.Random(3), 5), cache)
    base.save(tmp_path / "b")
    loaded = BaseIndex.load(tmp_path / "b", "fake")
    assert loaded is not None and loaded.root == base.root and loaded.chunks == base.chunks
    assert np.allclose(loaded.vectors, base.vectors, atol=1e-3)
    assert BaseIndex.load(tmp_path / "b", "another-model") is None
    (tmp_path / "b" / "chunks.json").write_text("{broken")
    assert BaseIndex.load(tmp_path / "b", "fake") is None and BaseIndex.load(tmp_path / "nothing", "fake") is None


@pytest.mark.parametrize("reverse", [False, True])
def test_merkle_paths_that_turn_from_file_to_directory_and_back(reverse):
    # Changes arrive in any order: a file replacing a directory must drop the directory's files,
    # and deleting the old file must not drop the directory that replaced it.
    steps = [
        {"d/inner.py": None, "d": "h4"},  # directory -> file
        {"d": None, "d/inner.py": "h1"},  # and back, with the original content
        {"x.py": None, "x.py/inner.py": "h5"},  # file -> directory
        {"x.py/inner.py": None, "x.py": "h2"},
    ]
    current = {"d/inner.py": "h1", "x.py": "h2", "keep.py": "h3"}
    tree = MerkleTree(current)
    for changes in steps:
        for path, digest in sorted(changes.items(), reverse=reverse):
            tree.set(path, digest)
        current = {p: h for p, h in (current | changes).items() if h is not None}
        assert tree.files == current and tree.root == MerkleTree(current).root


def test_view_finds_a_file_whose_directory_was_a_file_for_a_while():
    inner = "def d_inner_jackal():\n    return 4\n"
    view = IndexView(BaseIndex.build({"d/inner.py": inner, "a.py": "def alpha():\n    return 1\n"}, None), None)
    view.apply({"d": "def d_file_mink():\n    pass\n", "d/inner.py": None})  # refresh's order: changed, then removed
    assert [h.path for h in view.search("d_file_mink", 5, "bm25")] == ["d"]
    view.apply({"d/inner.py": inner, "d": None})
    assert [h.path for h in view.search("d_inner_jackal", 5, "bm25")] == ["d/inner.py"]
    assert view.search("d_file_mink", 5, "bm25") == [] and view.root == view.base.root


def test_minified_line_keeps_a_bounded_list_of_names():
    # 3,000 functions on one line: every span merges into the first chunk, which once kept (and
    # searched, per merge) all 3,000 names: quadratic time.
    text = "".join(f"function f{i}(a,b){{return a+b*{i}}};" for i in range(3000)) + "\n"
    chunks = chunk_file("min.js", text)
    check_cover(chunks, text)
    assert len(chunks) == 1 and chunks[0].symbols == tuple(f"f{i}" for i in range(MAX_SYMBOLS))


def test_hybrid_puts_the_chunk_holding_an_identifier_asked_for_above_its_near_duplicates():
    """An identifier query ("load_settings_v2") found its one definition first by BM25, but the
    embedding ranked short near-duplicates (load_settings_v3, ...) higher, and reciprocal-rank fusion,
    flat at the top, put a near-duplicate first. A chunk holding the identifier (in any spelling:
    loadSettingsV2) now ranks above the chunks that only resemble it; a plain-words query is fused as
    before."""
    filler = "\n".join(f"    step_{i} = helper_{i}(path, retries, timeout)" for i in range(12))
    texts = {"conf/v2.py": f"def load_settings_v2(path):\n{filler}\n    return path\n"}
    texts |= {f"conf/v{n}.py": f"def load_settings_v{n}(path):\n    return load(path, settings)\n" for n in range(3, 9)}
    texts["app/use.py"] = "def start():\n" + "    load_settings_v2(path)\n" * 6  # holds it 6 times, defines none
    cache = EmbeddingCache(FakeEmbedder())
    view = IndexView(BaseIndex.build(texts, cache), cache)
    assert "conf/v2.py" in [h.path for h in view.search("load_settings_v2", 2, "bm25")]
    assert view.search("load_settings_v2", 1, "dense")[0].path != "conf/v2.py"  # the case fusion lost
    for query in ("load_settings_v2", "where is loadSettingsV2 defined", "LOAD_SETTINGS_V2"):
        hits = [h.path for h in view.search(query, 3, "hybrid")]
        assert hits[:2] == ["conf/v2.py", "app/use.py"], query  # its definition, then a chunk using it
    rrf: dict[str, float] = {}
    for mode in ("bm25", "dense"):
        for rank, hit in enumerate(view.search("load settings", 100, mode)):
            rrf[hit.path] = rrf.get(hit.path, 0.0) + 1 / (61 + rank)
    plain = [h.path for h in view.search("load settings", 7, "hybrid")]  # no identifier asked for: RRF's order
    assert plain == sorted(rrf, key=lambda p: -rrf[p])[:7] and plain[0] != "conf/v2.py"


async def test_a_trees_lock_lives_only_while_it_is_used():
    """Each episode's edits make a new Merkle root, and one lock per root was kept for the process's life."""
    import asyncio
    import gc

    from vivace.search.config import SearchConfig
    from vivace.search.tree import Indexer

    indexer = Indexer(SearchConfig(), None)
    lock = indexer._root_lock("root-1")
    assert indexer._root_lock("root-1") is lock  # shared while it is held: one build per root at a time
    async with lock:
        pass
    del lock
    gc.collect()
    assert not indexer._locks[asyncio.get_running_loop()]
