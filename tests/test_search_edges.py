"""The semantic index at its edges, without the model: a base loaded from disk with a cache not
loaded yet, damaged cache files, odd git repositories, and Ctrl-C during a build.

The bag-of-words FakeEmbedder of test_search_index.py stands in for the model; each test that
needs "another process" makes a fresh EmbeddingCache over the same directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from test_search_index import FakeEmbedder
from vivace.search import scan
from vivace.search.config import SearchConfig
from vivace.search.embed import EmbeddingCache
from vivace.search.index import BaseIndex, embed_text
from vivace.search.tree import DirectorySource, Indexer
from vivace.search.view import IndexView

FILES = {
    "httpx/client.py": "def send_request(url, headers):\n    return url\n\n\ndef close_session(s):\n    return s\n",
    "httpx/auth.py": "def basic_auth_header(user, password):\n    return user + password\n",
    "web/cart.ts": "export function addToCart(item: string): string {\n  return item;\n}\n",
} | {f"lib/util_{i}.py": f"def helper_{i}(x):\n    return x * {i}\n" for i in range(30)}  # most files stay
ZEBRA = "def paint_zebra_stripes(canvas):\n    '''Paint zebra stripes on the canvas.'''\n    return canvas\n"


def write(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def indexer(cache_dir, embedder=None) -> Indexer:
    """A fresh indexer over `cache_dir`, as a new process would make it (nothing loaded yet)."""
    config = SearchConfig(cache_dir=cache_dir)
    return Indexer(config, EmbeddingCache(embedder or FakeEmbedder(), cache_dir / "embeddings"))


def check_hit(hit, root):
    """The hit's lines are its file's lines (a vector row shifted onto another chunk fails this)."""
    lines = (root / hit.path).read_text().split("\n")
    assert hit.snippet.split("\n")[0] == lines[(hit.snippet_line or hit.start_line) - 1], hit


def test_overlay_of_a_base_from_disk_is_in_dense_search(tmp_path):
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    write(repo, FILES)
    first = indexer(cache)
    root = asyncio.run(first.open(DirectorySource(repo, first.config))).view.root
    # edit, add and rename, then open in "another process" that reuses the saved base with an overlay
    write(repo, {"httpx/auth.py": FILES["httpx/auth.py"] + "\n\ndef digest_auth_nonce(n):\n    return n\n"})
    write(repo, {"zoo/zebra.py": ZEBRA})
    (repo / "web/cart.ts").rename(repo / "web/basket.ts")
    second = indexer(cache)
    second.store.get(root)
    state = asyncio.run(second.open(DirectorySource(repo, second.config)))
    assert state.view.base.root == root and state.view.root != root  # base + overlay, no new base
    for query, path in [("paint zebra stripes canvas", "zoo/zebra.py"), ("digest auth nonce", "httpx/auth.py"),
                        ("add to cart item", "web/basket.ts")]:  # fmt: skip
        hits = state.view.search(query, 3, "dense")
        assert hits and hits[0].path == path, (query, hits)
        check_hit(hits[0], repo)
    # the overlay's vectors were saved: a third process embeds nothing to open the same tree
    third = indexer(cache)
    third.store.get(root)
    asyncio.run(third.open(DirectorySource(repo, third.config)))
    assert third.cache.embedder.encoded == 0


def test_long_running_view_keeps_overlay_vectors_aligned(tmp_path):
    """The cache loads between two applies (another workspace's build): every overlay row still
    belongs to its chunk, with and without a directory filter."""
    base_texts = {p: t for p, t in FILES.items()}
    saved = EmbeddingCache(FakeEmbedder(), tmp_path)
    BaseIndex.build(base_texts, saved).save(tmp_path / "base")
    cache = EmbeddingCache(FakeEmbedder(), tmp_path)  # not loaded yet, as in a new process
    view = IndexView(BaseIndex.load(tmp_path / "base", "fake"), cache)
    view.apply({"zoo/zebra.py": ZEBRA})
    cache.embed(["something else in the process embeds a text"])
    view.apply({"httpx/retry.py": "def retry_with_backoff(fn, attempts):\n    return fn()\n"})
    view.apply({"web/cart.ts": None, "zoo/giraffe.py": "def feed_giraffe_leaves(tree):\n    return tree\n"})
    for query, path, dirs in [("paint zebra stripes canvas", "zoo/zebra.py", None),
                              ("retry with backoff attempts", "httpx/retry.py", ["httpx"]),
                              ("feed giraffe leaves", "zoo/giraffe.py", ["zoo"]),
                              ("paint zebra stripes", "zoo/zebra.py", ["zoo"])]:  # fmt: skip
        hits = view.search(query, 3, "dense", dirs)
        assert hits and hits[0].path == path, (query, hits)
        assert hits[0].snippet.startswith("def " + hits[0].symbol), hits[0]


# -- damaged cache files -------------------------------------------------------------------------


def damage(cache, what: str) -> None:
    base = next((cache / "bases").iterdir())
    shard = next((cache / "embeddings" / "fake").glob("shard-*.npz"))
    pointer = next((cache / "repos").iterdir())
    if what == "vectors_empty":
        (base / "vectors.npy").write_bytes(b"")
    elif what == "vectors_junk":
        (base / "vectors.npy").write_bytes(b"\x93NUMPY junk" * 10)
    elif what == "vectors_narrow":  # vectors of another width: every dense search failed on a matmul
        np.save(base / "vectors.npy", np.load(base / "vectors.npy")[:, :10])
    elif what.startswith("vectors_"):  # a well-formed file whose numbers are not: dense search found nothing
        vectors = np.load(base / "vectors.npy")
        vectors[:: 1 if what == "vectors_nan" else 3] = np.nan if what == "vectors_nan" else np.inf
        np.save(base / "vectors.npy", vectors)
    elif what in ("shard_nan", "shard_narrow"):  # a well-formed shard whose vectors are not: used as they were
        with np.load(shard) as data:
            keys, vectors = data["keys"], data["vectors"].copy()
        if what == "shard_nan":
            vectors[::2] = np.nan
        else:
            vectors = vectors[:, :10]
        with open(shard, "wb") as f:
            np.savez(f, keys=keys, vectors=vectors)
        shutil.rmtree(base)
    elif what.startswith("shard"):  # and no saved base, so the build reads the shard
        shard.write_bytes({"shard_truncated": shard.read_bytes()[:100], "shard_empty": b""}.get(what, os.urandom(500)))
        shutil.rmtree(base)
    elif what == "pointer_binary":
        pointer.write_bytes(b"\xff\xfe\x00garbage")


@pytest.mark.parametrize(
    "what",
    ["vectors_empty", "vectors_junk", "vectors_nan", "vectors_some_inf", "vectors_narrow", "shard_truncated",
     "shard_empty", "shard_junk", "shard_nan", "shard_narrow", "pointer_binary"],
)  # fmt: skip
def test_damaged_cache_files_are_rebuilt_with_a_warning(tmp_path, what, caplog):
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    write(repo, FILES)
    first = indexer(cache)
    state = asyncio.run(first.open(DirectorySource(repo, first.config)))
    first.store.set_last_root(repo, state.view.root)
    damage(cache, what)
    caplog.set_level(logging.WARNING)
    again = indexer(cache)
    last = again.store.last_root(repo)  # what `vivace index search` does first
    assert last == (None if what == "pointer_binary" else state.view.root)
    again.store.get(last) if last else None
    state = asyncio.run(again.open(DirectorySource(repo, again.config)))
    assert state.view.search("basic auth header user password", 1, "dense")[0].path == "httpx/auth.py"
    assert "damaged" in caplog.text
    if what.startswith("shard"):  # the bad shard is gone, its texts embedded again and saved anew
        if what == "shard_nan":  # read a row at a time: those read whole are kept
            assert 0 < again.cache.embedder.encoded < len(state.view.chunks())
        else:
            assert again.cache.embedder.encoded == len(state.view.chunks())
        again.cache.flush()
        fresh = EmbeddingCache(FakeEmbedder(), cache / "embeddings")
        fresh.embed([embed_text(c) for c in state.view.chunks()])
        assert fresh.embedder.encoded == 0  # nothing lost: every text is on disk again
        caplog.clear()
        EmbeddingCache(FakeEmbedder(), cache / "embeddings").embed(["x"])
        assert "damaged" not in caplog.text


def test_unwritable_cache_costs_a_warning_not_a_build(tmp_path, caplog):
    (tmp_path / "file").write_text("not a directory")
    cache = EmbeddingCache(FakeEmbedder(), tmp_path / "file")
    base = BaseIndex.build(FILES, cache)  # flush cannot write: the build still succeeds
    assert len(base.chunks) == len(base.vectors) and "could not save" in caplog.text


# -- which files a git repository indexes --------------------------------------------------------


def git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_git_repository_indexes_tracked_build_and_vendor_dirs(tmp_path):
    write(tmp_path, {"pkg/build/ops.py": "a\n", "vendor/lib.py": "b\n", "dist/new.py": "c\n", "target/x.rs": "d\n",
                     "src/main.py": "e\n", ".gitignore": "target/\n"})  # fmt: skip
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "pkg", "vendor", "src")
    paths = [p for p, _ in scan.candidates(str(tmp_path))]
    assert paths == ["dist/new.py", "pkg/build/ops.py", "src/main.py", "vendor/lib.py"]  # git's word, not SKIP_DIRS
    plain = tmp_path.parent / f"{tmp_path.name}-plain"  # outside the repository
    write(plain, {"build/ops.py": "a\n", "node_modules/m.js": "b\n", "src/main.py": "c\n"})
    assert [p for p, _ in scan.candidates(str(plain))] == ["src/main.py"]  # no git: SKIP_DIRS


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the repository to another user")
def test_repository_of_another_user_still_honours_gitignore(tmp_path):
    write(tmp_path, {"kept.py": "a\n", "secret.py": "b\n", ".gitignore": "secret.py\n"})
    git(tmp_path, "init", "-q")
    for d, dirs, names in os.walk(tmp_path):
        for name in [*dirs, *names, "."]:
            os.chown(os.path.join(d, name), 65534, 65534, follow_symlinks=False)
    assert [p for p, _ in scan.candidates(str(tmp_path))] == ["kept.py"]


def test_git_failing_in_a_repository_is_logged(tmp_path, monkeypatch, caplog):
    write(tmp_path, {"kept.py": "a\n", "secret.py": "b\n", ".gitignore": "secret.py\n"})
    git(tmp_path, "init", "-q")
    monkeypatch.setattr(scan, "GIT_LIST", ["ls-files", "--no-such-option"])
    assert [p for p, _ in scan.candidates(str(tmp_path))] == ["kept.py", "secret.py"]  # the walk, as before
    assert "indexing without .gitignore" in caplog.text
    caplog.clear()
    not_git = tmp_path.parent / f"{tmp_path.name}-plain"
    write(not_git, {"a.py": "a\n"})
    scan.candidates(str(not_git))
    assert caplog.text == ""  # not a repository: nothing to warn about


# -- Ctrl-C ------------------------------------------------------------------------------------------


class SlowEmbedder(FakeEmbedder):
    """8 texts per batch (the cache asks for batch_size * 8), 0.05 s per text; sends the process
    `signum` (Ctrl-C's SIGINT, or a job limit's SIGTERM) during its second batch."""

    batch_size = 1
    signum = signal.SIGINT

    def encode(self, texts):
        if self.calls == 1:
            os.kill(os.getpid(), self.signum)
        time.sleep(0.05 * len(texts))
        return super().encode(texts)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_a_build_between_batches(tmp_path, signum, capsys):
    """SIGTERM (`timeout`, `docker stop`, a CI job's limit) killed the build with nothing saved, so the
    next one embedded everything again; it now stops as Ctrl-C does, keeping what was embedded."""
    import typer

    from vivace.cli_index import _open

    repo = tmp_path / "repo"
    write(repo, {f"m{i}.py": f"def func_{i}(x):\n    return x + {i}\n" for i in range(120)})
    embedder = SlowEmbedder()
    embedder.signum = signum
    ix = indexer(tmp_path / "cache", embedder)
    with pytest.raises(typer.Exit) as stopped:
        _open(ix, repo, quiet=True, share=False)
    assert stopped.value.exit_code == 128 + signum
    assert f"stopped by {signal.Signals(signum).name}" in capsys.readouterr().err
    assert 0 < ix.cache.embedder.encoded < 120  # stopped between batches, not after all 15
    shards = (tmp_path / "cache" / "embeddings").rglob("shard-*.npz")
    assert sum(len(np.load(s)["keys"]) for s in shards) == ix.cache.embedder.encoded  # saved before Ctrl-C


def test_empty_query_is_refused():
    view = IndexView(BaseIndex.build(FILES, EmbeddingCache(FakeEmbedder())), EmbeddingCache(FakeEmbedder()))
    for query in ("", "  \n\t"):
        with pytest.raises(ValueError, match="the query is empty"):
            view.search(query, 5, "hybrid")


def test_submodules_and_nested_repositories_are_indexed(tmp_path):
    # git lists a submodule as one gitlink entry and a nested repository as "dir/": each is listed by
    # its own git (so its own .gitignore holds); an uninitialised submodule is an empty directory.
    lib, top = tmp_path / "lib", tmp_path / "top"
    write(lib, {"otter.py": "def lib_otter():\n    pass\n", "debug.log": "x\n", ".gitignore": "*.log\n"})
    git(lib, "init", "-q")
    git(lib, "add", ".")
    git(lib, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "lib")
    write(top, {"main.py": "def main():\n    pass\n", "nested/newt.py": "def nested_newt():\n    pass\n"})
    git(top, "init", "-q")
    git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(top / "nested", "init", "-q")
    sha = subprocess.run(["git", "-C", str(lib), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    git(top, "update-index", "--add", "--cacheinfo", f"160000,{sha},ghost")  # a submodule never checked out
    (top / "ghost").mkdir()
    paths = [p for p, _ in scan.candidates(str(top))]
    assert paths == ["main.py", "nested/newt.py", "vendor/lib/otter.py"]


# -- bases saved by many writers at once (rollout workers share one cache directory) ----------------


def _save_and_load(base, directory, rounds, failures):
    for _ in range(rounds):
        try:
            base.save(directory)
            failures.put(None if BaseIndex.load(directory, base.model) is not None else "a load found nothing")
        except Exception as e:  # noqa: BLE001 - reported to the parent
            failures.put(f"{type(e).__name__}: {e}")


def test_concurrent_saves_of_one_base_keep_one_whole_copy(tmp_path, caplog):
    import multiprocessing

    base = BaseIndex.build({f"m{i}.py": f"def f{i}():\n    return {i}\n" * 50 for i in range(40)}, None)
    directory = tmp_path / "bases" / base.root
    base.save(directory)
    ctx = multiprocessing.get_context("fork")  # processes, not threads: flock and rename must hold across them
    failures = ctx.Queue()
    workers = [ctx.Process(target=_save_and_load, args=(base, directory, 6, failures)) for _ in range(4)]
    for w in workers:
        w.start()
    _save_and_load(base, directory, 6, failures)  # and this process too
    for w in workers:
        w.join(60)
    results = [failures.get(timeout=10) for _ in range(30)]
    assert [r for r in results if r] == [] and "damaged" not in caplog.text
    assert os.listdir(directory.parent) == [base.root]  # no temporary copy left behind


def test_copies_left_by_killed_saves_are_swept_by_the_next_save(tmp_path):
    """A save or discard killed midway (SIGKILL) left its hidden copy, a whole base, in bases/ for good. The
    next save removes those untouched for an hour; a younger one may be a live writer's and stays."""
    base = BaseIndex.build(FILES, None)
    bases = tmp_path / "bases"
    base.save(bases / base.root)
    old_copy, old_aside, young = (bases / f".{base.root}.0badc0de", bases / f".{base.root}.old.12345678",
                                  bases / f".{'e' * 32}.c0ffee00")  # fmt: skip
    for leftover in (old_copy, old_aside, young):
        shutil.copytree(bases / base.root, leftover)
    (bases / ".keep-me").mkdir()  # not a name save() or _discard() makes
    hour_ago = time.time() - 3700
    for leftover in (old_copy, old_aside, bases / ".keep-me"):
        os.utime(leftover, (hour_ago, hour_ago))
    other = BaseIndex.build({"x.py": "def x():\n    return 1\n"}, None)
    other.save(bases / other.root)
    assert sorted(os.listdir(bases)) == sorted([base.root, other.root, young.name, ".keep-me"])


def test_save_replaces_what_is_not_the_same_base(tmp_path):
    base = BaseIndex.build(FILES, None)
    directory = tmp_path / "bases" / base.root
    directory.parent.mkdir()
    directory.write_text("a stray file")
    base.save(directory)
    assert BaseIndex.load(directory, None) is not None
    BaseIndex.build(FILES, EmbeddingCache(FakeEmbedder())).save(directory)  # same tree, another model
    assert BaseIndex.load(directory, "fake") is not None and BaseIndex.load(directory, None) is None
    assert os.listdir(directory.parent) == [base.root]


def test_a_base_replaced_while_it_was_read_is_not_removed(tmp_path, monkeypatch, caplog):
    # Another process found the base damaged and published a good one while this one read the old:
    # the good one must stay, and be read.
    base = BaseIndex.build(FILES, None)
    directory = tmp_path / "bases" / base.root
    base.save(directory)
    read = BaseIndex._read

    def replaced_meanwhile(cls, d, model, dim):
        monkeypatch.setattr(BaseIndex, "_read", classmethod(read.__func__))
        shutil.rmtree(d)
        base.save(d)
        raise ValueError("read half of the old copy")

    monkeypatch.setattr(BaseIndex, "_read", classmethod(replaced_meanwhile))
    assert BaseIndex.load(directory, None) is not None and "damaged" not in caplog.text
    assert BaseIndex.load(directory, None) is not None


@pytest.mark.parametrize("row", [["x", None], ["1", 2], [3, 2], [0, 0], [1, True]])
def test_chunk_rows_of_the_wrong_shape_are_damage(tmp_path, row, caplog):
    import json

    base = BaseIndex.build(FILES, None)
    directory = tmp_path / base.root
    base.save(directory)
    rows = json.loads((directory / "chunks.json").read_text())
    rows[0][1:3] = row
    (directory / "chunks.json").write_text(json.dumps(rows))
    assert BaseIndex.load(directory, None) is None and "damaged" in caplog.text and not directory.exists()


@pytest.mark.parametrize("damage", ["unknown_file", "symbols", "ungrouped", "short_row"])
def test_chunk_rows_that_do_not_fit_the_files_are_damage(tmp_path, damage, caplog):
    import json

    base = BaseIndex.build(FILES, None)
    directory = tmp_path / base.root
    base.save(directory)
    rows = json.loads((directory / "chunks.json").read_text())
    if damage == "unknown_file":
        rows[0][0] = "not/indexed.py"
    elif damage == "symbols":
        rows[0][3] = [1]
    elif damage == "ungrouped":
        rows.append(rows[0])
    else:
        rows[0] = rows[0][:4]
    (directory / "chunks.json").write_text(json.dumps(rows))
    assert BaseIndex.load(directory, None) is None and "damaged" in caplog.text


def test_files_over_max_files_are_counted_and_logged(tmp_path, caplog):
    write(tmp_path / "repo", FILES)
    config = SearchConfig(cache_dir=None, max_files=10)
    ix = Indexer(config, None)
    state = asyncio.run(ix.open(DirectorySource(tmp_path / "repo", config)))
    assert len(state.view.tree.files) == 10 and state.over_max_files == len(FILES) - 10
    assert f"{len(FILES) - 10} files over max_files=10 not indexed" in caplog.text


# A stand-in for JAX: bm25s runs `jax.lax.top_k` when it is imported, and the real one's first operation
# takes 75% of a GPU's memory. This one writes down the platforms JAX would have been allowed.
FAKE_JAX_LAX = """
import os
import numpy as np

def top_k(x, k):
    with open(os.environ["JAX_SEEN"], "w") as f:
        f.write(os.environ.get("JAX_PLATFORMS", "<unset>"))
    x = np.asarray(x)
    order = np.argsort(-x, axis=-1)[..., :k]
    return np.take_along_axis(x, order, -1), order
"""


@pytest.mark.parametrize("preset,seen", [(None, "cpu"), ("cuda", "cuda")])
def test_bm25s_keeps_jax_off_the_gpu_unless_told(tmp_path, preset, seen):
    """On a GPU machine whose image had JAX, the first index vivace built (importing bm25s) left JAX holding
    75% of the GPU: measured on an H200, the engine and trainer of the same process then ran out of memory.
    JAX is kept on the CPU for it; a JAX_PLATFORMS the user set is theirs."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text("from . import lax\n")
    (tmp_path / "jax" / "lax.py").write_text(FAKE_JAX_LAX)
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    path = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env |= {"PYTHONPATH": path, "JAX_SEEN": str(tmp_path / "seen")} | ({"JAX_PLATFORMS": preset} if preset else {})
    code = "from vivace.search.lexical import LexicalIndex\nprint(LexicalIndex([['add', 'total'], ['sub']]).scores(['add']))"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "seen").read_text() == seen


# -- what the cache keeps ------------------------------------------------------------------------------


def test_a_long_embedding_run_saves_as_it_goes(tmp_path, monkeypatch):
    """Vectors were saved only when a build ended, so a build killed (SIGKILL, the OOM killer) kept none."""
    from vivace.search import embed

    monkeypatch.setattr(embed, "SAVE_EVERY_S", 0.0)
    cache = EmbeddingCache(SlowEmbedder.__base__(), tmp_path / "emb")  # FakeEmbedder: 256 texts a step
    cache.embed([f"text number {i}" for i in range(600)])
    shards = list((tmp_path / "emb" / "fake").glob("shard-*.npz"))
    assert len(shards) == 3  # one per step of 256, with no flush called
    again = EmbeddingCache(FakeEmbedder(), tmp_path / "emb")
    again.embed([f"text number {i}" for i in range(600)])
    assert (len(again), again.embedder.encoded) == (600, 0)


def test_many_shards_are_merged_into_one_when_loaded(tmp_path):
    """Each flush adds a shard (each search that embeds an edit); thousands made every first search slow."""
    from vivace.search import embed
    from vivace.search.embed import MAX_SHARDS

    for i in range(MAX_SHARDS + 4):  # as flushes of as many processes leave them
        embed._save_shard(
            tmp_path / "emb" / "fake", [embed.text_key(f"edit {i}")], FakeEmbedder()._vectors([f"edit {i}"])
        )
    assert len(list((tmp_path / "emb" / "fake").glob("shard-*.npz"))) == MAX_SHARDS + 4
    merged = EmbeddingCache(FakeEmbedder(), tmp_path / "emb")
    merged.embed(["edit 0"])
    assert len(list((tmp_path / "emb" / "fake").glob("shard-*.npz"))) == 1
    again = EmbeddingCache(FakeEmbedder(), tmp_path / "emb")
    again.embed([f"edit {i}" for i in range(MAX_SHARDS + 4)])
    assert again.embedder.encoded == 0  # every vector is in the merged shard


def test_indexing_a_changed_tree_again_removes_the_base_it_replaces(tmp_path):
    """Every `vivace index build` of a changed tree saved a whole new base and none was ever removed;
    the one a repository's record replaces goes, unless another directory's record names it."""
    repo, twin, cache = tmp_path / "repo", tmp_path / "twin", tmp_path / "cache"
    write(repo, FILES)
    write(twin, FILES)
    ix = indexer(cache)
    first = asyncio.run(ix.open(DirectorySource(repo, ix.config), share=False)).view.root
    ix.store.set_last_root(repo, first)
    ix.store.set_last_root(twin, first)  # the same tree elsewhere: the base is shared
    write(repo, {"httpx/auth.py": ZEBRA})
    second = asyncio.run(ix.open(DirectorySource(repo, ix.config), share=False)).view.root
    ix.store.set_last_root(repo, second)
    assert sorted(p.name for p in (cache / "bases").iterdir()) == sorted([first, second])  # the twin's stays
    write(repo, {"httpx/client.py": ZEBRA})
    third = asyncio.run(ix.open(DirectorySource(repo, ix.config), share=False)).view.root
    ix.store.set_last_root(repo, third)
    assert sorted(p.name for p in (cache / "bases").iterdir()) == sorted([first, third])
    assert ix.store.last_root(repo) == third


def test_a_repository_whose_path_is_not_utf8_is_indexed_and_found(tmp_path):
    """A directory name that is not UTF-8 failed `index build` after the whole embedding, and every search."""
    repo = tmp_path / os.fsdecode(b"bad\xffdir")
    write(repo, FILES)
    ix = indexer(tmp_path / "cache")
    root = asyncio.run(ix.open(DirectorySource(repo, ix.config))).view.root
    ix.store.set_last_root(repo, root)
    assert indexer(tmp_path / "cache").store.last_root(repo) == root


def test_words_in_any_script_are_search_terms():
    """Only ASCII letters made terms: `grüße_sentinel` came out as "gr" and "e_sentinel", and Cyrillic or
    Chinese text as nothing, so a phrase in a comment was never found by terms."""
    from vivace.search.lexical import tokenize

    assert tokenize("def grüße_sentinel(): pass") == ["def", "grüße_sentinel", "grüße", "sentinel", "pass"]
    assert tokenize("функция_поиска") == ["функция_поиска", "функция", "поиска"]
    assert tokenize("computeTotalPrice x9 123abc") == [
        "computetotalprice",
        "compute",
        "total",
        "price",
        "x9",
        "123",
        "abc",
    ]
    files = {"a.py": "# 这个说法模棱两可的\ndef f():\n    pass\n", "b.py": "# 用户登录\ndef g():\n    pass\n"}
    view = IndexView(BaseIndex.build(files, EmbeddingCache(FakeEmbedder())), EmbeddingCache(FakeEmbedder()))
    assert view.search("模棱两可", 1, "bm25")[0].path == "a.py"
    assert view.search("функция", 1, "bm25") == []


def test_files_in_legacy_encodings_are_indexed_as_their_words(tmp_path):
    """A Latin-1 file was read with U+FFFD for each accented letter, so its words were cut ("caf?");
    a UTF-16 file (byte-order mark, NUL bytes) was skipped as binary. Both are text, searched by
    their words, and a file that really is binary is still skipped."""
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    repo.mkdir()
    (repo / "menu.py").write_bytes("def prix_du_café():\n    return 'crème brûlée'\n".encode("latin-1"))
    (repo / "win.ps1").write_bytes("function Get-Résumé {\n  'zèbre'\n}\n".encode("utf-16"))
    (repo / "blob.bin").write_bytes(b"\x00\x01\x02binary " + "zèbre".encode())
    (repo / "plain.py").write_text("def ordinary():\n    return 'déjà vu'\n")
    idx = indexer(cache)
    state = asyncio.run(idx.open(DirectorySource(repo, idx.config)))
    assert state.skipped == 1
    assert [h.path for h in state.view.search("crème brûlée", 3, "bm25")][:1] == ["menu.py"]
    hit = state.view.search("zèbre", 3, "bm25")[0]
    assert hit.path == "win.ps1" and "function Get-Résumé {" in hit.snippet
    assert [h.path for h in state.view.search("déjà", 3, "bm25")][:1] == ["plain.py"]


def test_saved_bases_past_the_cache_size_go_least_recently_used_first(tmp_path, monkeypatch):
    """Every snapshot an agent searched saved a base (~30 MB for a large repository) and none was ever
    removed: an RL run over many repositories grew the cache without bound. Past the size, the least
    recently used go, except one used within the idle time or named by a directory's record."""
    from vivace.search import store as store_mod
    from vivace.search.store import BaseStore

    monkeypatch.setattr(store_mod, "MIN_IDLE_S", 60.0)
    monkeypatch.setattr(store_mod, "MAX_BASES_BYTES", 0)
    store = BaseStore(None, tmp_path / "cache", capacity=1)
    bases = tmp_path / "cache" / "bases"
    recorded, old, used_again = (BaseIndex.build({f"{n}.py": f"def {n}():\n    return 1\n"}, None) for n in "abc")
    for base in (used_again, recorded, old):  # `old` last: the one in memory
        store.put(base)
    hour_ago = time.time() - 3700
    for base in (used_again, recorded, old):  # aged once all are saved: each save prunes what is idle
        os.utime(bases / base.root, (hour_ago, hour_ago))
    store.set_last_root(tmp_path, recorded.root)  # `vivace index build` of a directory
    assert store.get(used_again.root) is not None  # from disk (capacity 1: not in memory): used now
    newest = BaseIndex.build({"d.py": "def d():\n    return 1\n"}, None)
    store.put(newest)
    assert sorted(p.name for p in bases.iterdir()) == sorted([recorded.root, used_again.root, newest.root])
    assert store.get(old.root) is None  # gone: it is rebuilt when next searched


def test_pruning_without_any_directory_record_removes_idle_bases(tmp_path, monkeypatch, caplog):
    """No `index build` record yet (no repos/ directory): reading the records failed, the save was logged
    as failed, and nothing was pruned."""
    from vivace.search import store as store_mod
    from vivace.search.store import BaseStore

    monkeypatch.setattr(store_mod, "MAX_BASES_BYTES", 0)
    store = BaseStore(None, tmp_path / "cache")
    idle = BaseIndex.build({"a.py": "def a():\n    return 1\n"}, None)
    store.put(idle)
    hour_ago = time.time() - 3700
    os.utime(tmp_path / "cache" / "bases" / idle.root, (hour_ago, hour_ago))
    store.put(BaseIndex.build({"b.py": "def b():\n    return 1\n"}, None))
    assert not (tmp_path / "cache" / "bases" / idle.root).exists()
    assert "could not save" not in caplog.text


def test_pruning_spares_a_base_recorded_while_it_waited_for_the_lock(tmp_path, monkeypatch):
    """prune read the directories' records before taking the bases' lock: a `vivace index build` recording
    an idle base meanwhile (under that lock) had it removed right after naming it."""
    import threading

    from vivace.search import store as store_mod
    from vivace.search.index import bases_locked
    from vivace.search.store import BaseStore

    monkeypatch.setattr(store_mod, "MAX_BASES_BYTES", 0)
    store = BaseStore(None, tmp_path / "cache")
    bases = tmp_path / "cache" / "bases"
    idle = BaseIndex.build({"a.py": "def a():\n    return 1\n"}, None)
    store.put(idle)
    hour_ago = time.time() - 3700
    os.utime(bases / idle.root, (hour_ago, hour_ago))
    with bases_locked(bases):  # as set_last_root holds it: prune waits, then must see the new record
        pruning = threading.Thread(target=store.prune)
        pruning.start()
        time.sleep(0.5)
        pointer = store._pointer(tmp_path)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.write_text(idle.root + "\n")
    pruning.join(10)
    assert (bases / idle.root / "meta.json").is_file()
    assert store.last_root(tmp_path) == idle.root
