"""The search cache on disk shared by processes: merging shards, transient read errors, directory
records, damaged metadata, concurrent builds and failed writes.

"Another process" is a fresh EmbeddingCache or BaseStore over the same directory (flock locks of
separate opens conflict within one process too); FakeEmbedder stands in for the model.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from test_search_edges import FILES, write
from test_search_index import FakeEmbedder
from vivace.search import embed
from vivace.search.config import SearchConfig
from vivace.search.embed import MAX_SHARDS, EmbeddingCache
from vivace.search.index import BaseIndex, bases_locked
from vivace.search.store import BaseStore
from vivace.search.tree import DirectorySource, Indexer


def make_shards(directory: Path, n: int) -> None:
    for i in range(n):  # as flushes of as many processes leave them
        embed._save_shard(directory, [embed.text_key(f"edit {i}")], FakeEmbedder()._vectors([f"edit {i}"]))


def on_disk(directory: Path) -> tuple[int, int]:
    """(shards, vectors) in `directory`."""
    shards = list(directory.glob("shard-*.npz"))
    return len(shards), sum(len(np.load(s)["keys"]) for s in shards)


# -- merging shards ------------------------------------------------------------------------------------


def test_shards_another_process_is_merging_are_left_to_it(tmp_path):
    shards = tmp_path / "emb" / "fake"
    make_shards(shards, MAX_SHARDS + 4)
    lock = os.open(shards / ".merge.lock", os.O_RDWR | os.O_CREAT)
    try:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)  # the other process, merging
        EmbeddingCache(FakeEmbedder(), tmp_path / "emb").embed(["edit 0"])
    finally:
        os.close(lock)
    assert on_disk(shards) == (MAX_SHARDS + 4, MAX_SHARDS + 4)


def test_a_merge_replaces_only_shards_still_there(tmp_path, monkeypatch):
    """Processes starting at once each wrote a whole merged copy: 20 shards of 80k vectors became 4
    holding 160k. One that listed the shards before another merged them writes nothing more."""
    shards = tmp_path / "emb" / "fake"
    make_shards(shards, MAX_SHARDS + 4)
    listed = []
    monkeypatch.setattr(EmbeddingCache, "_merge_shards", lambda self, loaded: listed.append((self, loaded)))
    EmbeddingCache(FakeEmbedder(), tmp_path / "emb").embed(["edit 0"])  # loaded all; merging next
    monkeypatch.undo()
    EmbeddingCache(FakeEmbedder(), tmp_path / "emb").embed(["edit 0"])  # meanwhile another merges them
    assert on_disk(shards) == (1, MAX_SHARDS + 4)
    late, loaded = listed[0]
    late._merge_shards(loaded)
    assert on_disk(shards) == (1, MAX_SHARDS + 4)


# -- transient errors are not damage -----------------------------------------------------------------


def test_a_shard_that_cannot_be_opened_for_now_stays(tmp_path, monkeypatch, caplog):
    """EMFILE, EACCES or EIO deleted the shard as damaged: hours of embedding, lost to a passing error."""
    shards = tmp_path / "emb" / "fake"
    make_shards(shards, 2)
    victim = sorted(shards.glob("shard-*.npz"))[0]

    def flaky(path, *args, **kwargs):
        if Path(path) == victim:
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(embed, "open", flaky, raising=False)
    cache = EmbeddingCache(FakeEmbedder(), tmp_path / "emb")
    cache.embed(["x"])
    assert victim.exists() and "could not read" in caplog.text and "damaged" not in caplog.text
    monkeypatch.undo()
    again = EmbeddingCache(FakeEmbedder(), tmp_path / "emb")
    again.embed(["edit 0", "edit 1"])
    assert again.embedder.encoded == 0


def test_a_base_that_cannot_be_read_for_now_stays(tmp_path, monkeypatch, caplog):
    base = BaseIndex.build(FILES, None)
    directory = tmp_path / "bases" / base.root
    base.save(directory)
    read_text = Path.read_text

    def flaky(self, *args, **kwargs):
        if self.name == "chunks.json":
            raise OSError(errno.EMFILE, "Too many open files", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", flaky)
    assert BaseIndex.load(directory, None) is None
    monkeypatch.undo()
    assert BaseIndex.load(directory, None) is not None
    assert "could not read" in caplog.text and "damaged" not in caplog.text


# -- directory records ---------------------------------------------------------------------------------


def saved_bases(store: BaseStore, n: int) -> list[str]:
    bases = [BaseIndex.build({f"{i}.py": f"def f{i}():\n    return {i}\n"}, None) for i in range(n)]
    for base in bases:
        store.put(base)
    return [base.root for base in bases]


def test_a_search_recording_an_older_base_after_a_build_keeps_the_builds(tmp_path):
    """A search opened the old base, a build of the same directory replaced it, then the search recorded
    the old root: it removed the build's base, and pointed to the removed one. Neither was left."""
    store, repo = BaseStore(None, tmp_path / "cache"), tmp_path / "repo"
    old, new = saved_bases(store, 2)
    store.set_last_root(repo, old)
    store.set_last_root(repo, new)  # the build: the old base goes
    assert not store.saved(old)
    store.set_last_root(repo, old)  # the search that opened the old base before
    assert store.last_root(repo) == new and store.saved(new)


def test_records_change_under_the_bases_lock(tmp_path):
    store, repo = BaseStore(None, tmp_path / "cache"), tmp_path / "repo"
    (root,) = saved_bases(store, 1)
    with bases_locked(tmp_path / "cache" / "bases"):  # another process removing or publishing a base
        writer = threading.Thread(target=store.set_last_root, args=(repo, root))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive() and store.last_root(repo) is None
    writer.join(10)
    assert store.last_root(repo) == root


def test_a_base_whose_save_failed_is_not_recorded(tmp_path):
    store = BaseStore(None, tmp_path / "cache")
    saved_bases(store, 1)
    base = BaseIndex.build(FILES, None)
    store._remember(base)  # built and in memory; its save failed
    store.set_last_root(tmp_path / "repo", base.root)
    assert store.last_root(tmp_path / "repo") is None


def test_records_a_killed_writer_left_are_neither_records_nor_kept(tmp_path):
    """`repos/.<key>.<pid>` of a failed write was read as a record, keeping its base for good, and stayed."""
    store, repo = BaseStore(None, tmp_path / "cache"), tmp_path / "repo"
    old, new = saved_bases(store, 2)
    store.set_last_root(repo, old)
    pointer = next((tmp_path / "cache" / "repos").iterdir())
    young, stale = (pointer.with_name(f".{pointer.name}.{pid}") for pid in (123, 456))
    for leftover in (young, stale):
        leftover.write_text(old + "\n")
    hour_ago = time.time() - 3700
    os.utime(stale, (hour_ago, hour_ago))
    store.set_last_root(repo, new)
    assert not store.saved(old)
    assert young.exists() and not stale.exists()  # a young one may be a live writer's


# -- damaged metadata ------------------------------------------------------------------------------------


def test_a_base_whose_file_hashes_changed_is_replaced(tmp_path, caplog):
    """One hash digit changed in meta.json (still valid JSON): the base was never used, as its files'
    root is another, and never replaced, as a save compared meta.json's own "root" field."""
    store = BaseStore(None, tmp_path / "cache")
    base = BaseIndex.build(FILES, None)
    store.put(base)
    meta_file = tmp_path / "cache" / "bases" / base.root / "meta.json"
    meta = json.loads(meta_file.read_text())
    path = sorted(meta["files"])[0]
    meta["files"][path] = ("0" if meta["files"][path][0] != "0" else "1") + meta["files"][path][1:]
    meta_file.write_text(json.dumps(meta))
    again = BaseStore(None, tmp_path / "cache")
    assert again.get(base.root) is None and "damaged" in caplog.text
    again.put(base)
    assert BaseStore(None, tmp_path / "cache").get(base.root) is not None


def test_a_save_replaces_a_base_whose_file_hashes_changed(tmp_path):
    base = BaseIndex.build(FILES, None)
    directory = tmp_path / "bases" / base.root
    base.save(directory)
    meta = json.loads((directory / "meta.json").read_text())
    meta["files"][sorted(meta["files"])[0]] = "0" * 32
    (directory / "meta.json").write_text(json.dumps(meta))
    base.save(directory)  # kept the damaged copy: its "root" field is still right
    assert BaseIndex.load(directory, None) is not None


def test_a_base_saved_under_another_root_is_removed(tmp_path, caplog):
    store = BaseStore(None, tmp_path / "cache")
    (root,) = saved_bases(store, 1)
    wrong = tmp_path / "cache" / "bases" / ("f" * 32)
    (tmp_path / "cache" / "bases" / root).rename(wrong)
    assert store.get(wrong.name) is None and not wrong.exists() and "another tree" in caplog.text


# -- concurrent builds -----------------------------------------------------------------------------------


class SlowEmbedder(FakeEmbedder):
    def encode(self, texts):
        time.sleep(0.5)  # both builds are under way at once
        return super().encode(texts)


def test_two_builds_of_one_tree_at_once_embed_it_once(tmp_path):
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    write(repo, FILES)
    indexers = [Indexer(SearchConfig(cache_dir=cache), EmbeddingCache(SlowEmbedder(), cache / "embeddings"))
                for _ in range(2)]  # fmt: skip
    roots = []
    threads = [
        threading.Thread(target=lambda ix=ix: roots.append(asyncio.run(ix.open(DirectorySource(repo, ix.config))).view.root))
        for ix in indexers
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(roots) == 2 and roots[0] == roots[1]
    encoded = sorted(ix.cache.embedder.encoded for ix in indexers)
    assert encoded[0] == 0 and encoded[1] > 0


# -- failed writes ------------------------------------------------------------------------------------------


def test_vectors_whose_flush_failed_are_saved_by_the_next(tmp_path, caplog):
    (tmp_path / "fake").write_text("a file where the shard directory goes: saving fails as on a full disk")
    cache = EmbeddingCache(FakeEmbedder(), tmp_path)
    cache.embed([f"text {i}" for i in range(100)])
    cache.flush()
    assert "could not save" in caplog.text
    (tmp_path / "fake").unlink()  # room again
    cache.embed([f"text {i}" for i in range(100, 110)])
    cache.flush()
    assert on_disk(tmp_path / "fake") == (1, 110)


def test_a_directory_named_like_a_shard_is_not_damage(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    make_shards(tmp_path / "fake", 1)
    (tmp_path / "fake" / "shard-aaaaaaaaaaaa.npz").mkdir()
    EmbeddingCache(FakeEmbedder(), tmp_path).embed(["edit 0"])
    assert caplog.text == "" and (tmp_path / "fake" / "shard-aaaaaaaaaaaa.npz").is_dir()


# -- reading the cache ------------------------------------------------------------------------------------


def test_a_process_holds_the_vectors_it_looks_up_not_the_whole_cache(tmp_path):
    """Every process that embedded anything loaded every vector ever cached (2.2 KB each: +1.1 GB at 500k);
    now it reads the keys and maps the vectors, holding only those it looks up."""
    texts = [f"def f{i}(): return {i}" for i in range(3000)]
    first = EmbeddingCache(FakeEmbedder(), tmp_path)
    expected = first.embed(texts)
    first.flush()
    later = EmbeddingCache(FakeEmbedder(), tmp_path)
    wanted = [3, 1500, 2999]
    got = later.embed([texts[i] for i in wanted] + ["def new(): pass"])
    assert later.embedder.encoded == 1 and len(later) == 4  # the one new text; the others looked up
    assert np.allclose(got[:3], expected[wanted], atol=1e-3)  # stored as float16
    (shard,) = later._shards
    assert isinstance(shard.vectors, np.memmap)


def test_shards_written_unsorted_or_compressed_are_still_read(tmp_path):
    """Shards from before keys were sorted, or written by another tool with compression: found all the same."""
    texts = [f"text {i}" for i in range(50)]
    vectors = FakeEmbedder()._vectors(texts).astype(np.float16)
    keys = np.frombuffer(b"".join(embed.text_key(t) for t in texts), dtype="S16")
    (tmp_path / "fake").mkdir()
    np.savez(tmp_path / "fake" / "shard-000000000001.npz", keys=keys[:25][::-1], vectors=vectors[:25][::-1])
    np.savez_compressed(tmp_path / "fake" / "shard-000000000002.npz", keys=keys[25:], vectors=vectors[25:])
    cache = EmbeddingCache(FakeEmbedder(), tmp_path)
    got = cache.embed(texts)
    assert cache.embedder.encoded == 0 and np.allclose(got, vectors.astype(np.float32))
    assert [isinstance(s.vectors, np.memmap) for s in cache._shards] == [True, False]
