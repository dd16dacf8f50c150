"""`vivace index build|search` on a directory (the saved index is reused, edits are picked up),
errors that say what to do, and the long benchmarks (slow): `index bench` at a small size and
`index train-embedder` over oracle trajectories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest
from typer.testing import CliRunner

from vivace.cli import app

runner = CliRunner()


def invoke(*args: str):
    """(exit code, stdout); on failure stdout + stderr, to see why."""
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


def test_index_build_then_search(tmp_path):
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    (repo / "geo").mkdir(parents=True)
    (repo / "geo" / "distance.py").write_text(
        "def haversine(a, b):\n    '''Great-circle distance in km.'''\n    return 0\n"
    )
    (repo / "shop.go").write_text("package shop\n\nfunc TotalPrice(items []int) int { return len(items) }\n")
    for i in range(10):
        (repo / f"util_{i}.rs").write_text(f"pub fn helper_{i}(x: u32) -> u32 {{ x + {i} }}\n")
    code, out = invoke("index", "build", "--repo", str(repo), "--cache-dir", str(cache), "--json")
    assert code == 0, out
    built = json.loads(out)
    assert built["files"] == 12 and built["chunks"] == 12
    code, out = invoke(
        "index", "search", "distance on a sphere", "--repo", str(repo), "--cache-dir", str(cache), "--json"
    )
    assert code == 0, out
    hits = json.loads(out)
    assert hits[0]["path"] == "geo/distance.py" and hits[0]["symbol"] == "haversine" and hits[0]["start_line"] == 1
    (repo / "shop.go").write_text("package shop\n\nfunc ApplyVoucher(total int) int { return total - 5 }\n")
    code, out = invoke("index", "search", "ApplyVoucher", "--repo", str(repo), "--cache-dir", str(cache), "--k", "1",
                       "--mode", "bm25")  # fmt: skip
    assert code == 0 and out.startswith("shop.go:1-3"), out
    assert len(list((cache / "bases").iterdir())) == 1  # the edit lives in an overlay, not a second base


def test_build_after_edits_reports_and_saves_the_current_tree(tmp_path):
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    for i in range(12):
        (repo / f"pkg/m{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (repo / f"pkg/m{i}.py").write_text(f"def helper_{i}(x):\n    return x + {i}\n")
    (repo / "blob.bin").write_bytes(b"\x00\x01" * 100)
    result = runner.invoke(app, ["index", "build", "--repo", str(repo), "--cache-dir", str(cache)])
    assert result.exit_code == 0, result.output
    assert "chunking files: 12/12" in result.output and "embedding chunks: 12/12" in result.output  # not a terminal
    assert "12 files as 12 chunks (12 embedded now; 1 skipped" in result.output
    (repo / "pkg/m0.py").unlink()
    (repo / "pkg/m1.py").unlink()
    (repo / "pkg/new.py").write_text("def fresh_one(x):\n    return x\n\n\ndef fresh_two(y):\n    return y\n")
    code, out = invoke("index", "build", "--repo", str(repo), "--cache-dir", str(cache), "--json")
    assert code == 0, out
    built = json.loads(out)
    assert (
        built["files"] == 11 and built["chunks"] == 11 and built["chunks_embedded"] == 1 and built["files_skipped"] == 1
    )
    assert (cache / "bases" / built["root"] / "meta.json").is_file()  # the reported root is saved


def test_markup_in_paths_and_queries_is_printed_as_is(tmp_path):
    repo, cache = tmp_path / "repo", str(tmp_path / "cache")
    (repo / "pages/blog").mkdir(parents=True)
    (repo / "pages/blog/[slug].tsx").write_text(
        "export default function BlogPostPage(slug: string) {\n  return slug;\n}\n"
    )
    code, out = invoke("index", "search", "BlogPostPage", "--repo", str(repo), "--cache-dir", cache, "--mode", "bm25")
    assert code == 0 and out.startswith("pages/blog/[slug].tsx:1-3 (BlogPostPage)"), out
    code, out = invoke("index", "search", "[/]", "--repo", str(repo), "--cache-dir", cache, "--mode", "bm25")
    assert code == 0 and out == "No results for '[/]'.\n", out
    for query in ("", "   "):
        code, out = invoke("index", "search", query, "--repo", str(repo), "--cache-dir", cache)
        assert code == 2 and "the query is empty" in out


def test_terminal_escapes_in_a_repository_are_shown_not_obeyed(tmp_path):
    """A file (or a file name) holding ESC sequences: a search prints them as `\\x1b`, so the file
    cannot clear, retitle or recolour the terminal of whoever searches the repository."""
    repo, cache = tmp_path / "repo", str(tmp_path / "cache")
    repo.mkdir()
    (repo / "evil\x1b[2Jname.py").write_text("def payload_marker():\n    return '\x1b]0;pwned\x07\x1b[2J\x9b31m'\n")
    code, out = invoke("index", "search", "payload_marker", "--repo", str(repo), "--cache-dir", cache, "--mode", "bm25")
    assert code == 0, out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, repr(out)
    assert "evil\\x1b[2Jname.py:1-2 (payload_marker)" in out and "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in out, out


def test_a_newline_in_a_file_name_stays_on_its_result_line(tmp_path):
    """A file named "a\\n9999 fake" printed raw split the header into a line that read as a line of code."""
    repo, cache = tmp_path / "repo", str(tmp_path / "cache")
    repo.mkdir()
    (repo / "real\n9999  import os\tx.py").write_text("def payload_marker():\n    return 1\n")
    code, out = invoke("index", "search", "payload_marker", "--repo", str(repo), "--cache-dir", cache, "--mode", "bm25")
    assert code == 0, out
    assert out.splitlines()[0].startswith("real\\n9999  import os\\tx.py:1-2 (payload_marker)  "), out
    assert len(out.splitlines()) == 3, out  # the header and the two lines of the chunk


def _bogus_model(tmp_path):
    model = tmp_path / "bogus_model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # looks like a model until it loads
    return str(model)


def test_a_broken_model_over_a_saved_index_says_so(tmp_path):
    """The saved index of a repository asks the model for its width when it is read: a model that does
    not load gave a 190-line traceback there (exit 1) instead of the message a first build gives."""
    repo, cache = tmp_path / "repo", str(tmp_path / "cache")
    repo.mkdir()
    (repo / "src.py").write_text("def f():\n    pass\n")
    assert invoke("index", "build", "--repo", str(repo), "--cache-dir", cache)[0] == 0
    code, out = invoke(
        "index", "search", "f", "--repo", str(repo), "--cache-dir", cache, "--model", _bogus_model(tmp_path)
    )
    assert code == 2 and "could not load the embedding model" in out and "Traceback" not in out, out


def test_index_bench_with_a_broken_model_says_so(tmp_path):
    code, out = invoke("index", "bench", "--files", "2", "--chunks", "2", "--workspaces", "1",
                       "--model", _bogus_model(tmp_path))  # fmt: skip
    assert code == 2 and "could not load the embedding model" in out, out


def test_sigterm_stops_index_bench_and_removes_its_temporary_directory(tmp_path):
    """`timeout` (SIGTERM) killed the bench outright, leaving its synthetic repositories in /tmp."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vivace", "index", "bench", "--files", "400", "--chunks", "4000", "--workspaces", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for line in proc.stderr:  # the run is under way once it says what it measures first
            if "localization" in line:
                break
        assert list(tmp_path.glob("vivace-index-bench-*")), "the bench made no temporary directory under TMPDIR"
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in rest, rest
    assert not list(tmp_path.glob("vivace-index-bench-*"))


def test_index_errors(tmp_path):
    code, out = invoke("index", "search", "x", "--repo", str(tmp_path / "missing"))
    assert code == 2 and "is not a directory" in out
    code, out = invoke("index", "search", "x", "--repo", str(tmp_path), "--mode", "fuzzy")
    assert code == 2 and "unknown --mode 'fuzzy'; modes: bm25, dense, hybrid" in out
    code, out = invoke(
        "index", "build", "--repo", str(tmp_path), "--model", str(tmp_path), "--cache-dir", str(tmp_path)
    )
    assert code == 2 and "not a sentence-transformers model directory" in out
    (tmp_path / "a_file").write_text("")
    code, out = invoke("index", "build", "--repo", str(tmp_path), "--cache-dir", str(tmp_path / "a_file"))
    assert code == 2 and "--cache-dir" in out and "a_file is a file; give a directory" in out
    (tmp_path / "bogus_model").mkdir()
    (tmp_path / "bogus_model" / "config.json").write_text("{}")  # looks like a model until it loads
    (tmp_path / "src.py").write_text("def f():\n    pass\n")
    code, out = invoke("index", "build", "--repo", str(tmp_path), "--model", str(tmp_path / "bogus_model"),
                       "--cache-dir", str(tmp_path / "cache"))  # fmt: skip
    assert code == 2 and "could not load the embedding model" in out, out
    code, out = invoke("index", "train-embedder", "--traces", str(tmp_path / "none"))
    assert code == 2 and "does not exist" in out


@pytest.mark.slow
def test_index_bench_small():
    code, out = invoke("index", "bench", "--files", "60", "--chunks", "600", "--workspaces", "10", "--json")
    assert code == 0, out
    r = json.loads(out)
    assert set(r["localization"]) == {"tasks", "bm25", "dense", "hybrid"} and r["localization"]["tasks"] == 120
    assert r["sharing"]["bases_built"] == 1 and r["sharing"]["chunk_texts_embedded"] == r["sharing"]["base_chunks"]
    assert r["incremental"]["workspace"]["found_top10"] == r["incremental"]["workspace"]["edits"]
    assert r["latency"]["chunks"] >= 600


@pytest.mark.slow
def test_train_embedder_improves_heldout_recall(tmp_path):
    runs, state = tmp_path / "traces", tmp_path / "state"
    code, out = invoke(
        "bench", "--model", "scripted:oracle", "--suite", "bugs", "--out", str(runs), "--state-dir", str(state)
    )
    assert code == 0, out
    code, out = invoke("index", "train-embedder", "--traces", str(runs), "--out", str(tmp_path / "model"),
                       "--state-dir", str(state), "--json")  # fmt: skip
    assert code == 0, out
    r = json.loads(out)
    assert r["after"]["recall@5"] > r["before"]["recall@5"]
    code, out = invoke("index", "build", "--repo", str(tmp_path / "model"), "--model", str(tmp_path / "model"),
                       "--cache-dir", str(tmp_path / "cache"), "--json")  # fmt: skip
    assert code == 0, out  # the tuned model is a model directory the index loads


def test_train_embedder_refuses_traces_that_give_no_batch_before_loading_a_model(tmp_path, monkeypatch):
    # Two resolved episodes: one task trains, one is held out, and one pair makes no batch of two, so
    # nothing trained and the "fine-tuned" model was the base one (with numpy's empty-mean warning).
    from vivace.search import finetune
    from vivace.search.chunking import Chunk

    held = next(t for t in (f"t{i}" for i in range(100)) if finetune.heldout(t, 0.25, 0))
    trained = next(t for t in (f"t{i}" for i in range(100)) if not finetune.heldout(t, 0.25, 0))
    chunk = Chunk(path="a.py", start=1, end=1, text="def f(): pass", symbols=("f",))
    episodes = [finetune.Episode(t, ["fix f"], [chunk], {"fix f": {0}}) for t in (trained, held)]
    monkeypatch.setattr(finetune, "mine_episodes", lambda traces, work: (episodes, "0 skipped"))
    monkeypatch.setattr(finetune, "Embedder", lambda *a: pytest.fail("a model was loaded"))
    (tmp_path / "traces").mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    code, out = invoke("index", "train-embedder", "--traces", str(tmp_path / "traces"), "--out", str(tmp_path / "m"))
    assert code == 2 and "nothing would train" in " ".join(out.split()), out
    assert list((tmp_path / "tmp").iterdir()) == []  # its work directory was left in /tmp on every run


def test_json_output_is_utf8_with_names_that_are_not(tmp_path):
    import os

    repo, cache = tmp_path / "repo", str(tmp_path / "cache")
    repo.mkdir()
    name = os.fsdecode(b"caf\xe9_menu.py")  # not UTF-8: held as a lone surrogate
    (repo / name).write_text("def list_coffee_menu_items():\n    return []\n")
    for args in (["build"], ["search", "coffee menu", "--mode", "bm25"]):
        result = runner.invoke(app, ["index", *args, "--repo", str(repo), "--cache-dir", cache, "--json"])
        assert result.exit_code == 0, result.output
        got = json.loads(result.stdout_bytes.decode("utf-8"))  # strict: raw surrogate bytes would fail here
    assert got[0]["path"] == name


def test_huge_query_is_cut_when_quoted(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("def f():\n    pass\n")
    query = "qqqqzzzz " * 10_000
    code, out = invoke(
        "index", "search", query, "--repo", str(repo), "--cache-dir", str(tmp_path / "c"), "--mode", "bm25"
    )
    assert code == 0 and out == f"No results for {query[:200] + '…'!r}.\n", out[:300]


def test_build_says_what_it_left_out_and_what_it_could_not_save(tmp_path, monkeypatch):
    from vivace import cli_index

    repo, cache = tmp_path / "repo", tmp_path / "cache"
    repo.mkdir()
    for i in range(5):
        (repo / f"m{i}.py").write_text(f"def helper_{i}():\n    return {i}\n")
    cache.mkdir()
    (cache / "bases").write_text("not a directory: no base can be saved")
    config = cli_index._config
    monkeypatch.setattr(cli_index, "_config", lambda model, cache_dir, **kw: config(model, cache_dir, max_files=3))
    code, out = invoke("index", "build", "--repo", str(repo), "--cache-dir", str(cache), "--json")
    assert code == 0, out
    built = json.loads(out)
    assert built["files"] == 3 and built["files_over_max_files"] == 2 and built["saved"] is False
    result = runner.invoke(app, ["index", "build", "--repo", str(repo), "--cache-dir", str(cache)])
    text = " ".join(result.output.split())
    assert "2 files over max_files=3 not indexed" in text and "NOT saved" in text, text


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        (b'{"resolved": false}\n[1, 2]\n"text"\n{"resolved": tru', "'unreadable': 3"),  # skipped and counted
        (b'{"resolved": false}\n{"task_id": "caf\xe9"}\n', "results.jsonl:2: not UTF-8 text"),
    ],
)
def test_train_embedder_names_bad_rows_of_results(tmp_path, rows, says):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.jsonl").write_bytes(rows)
    code, out = invoke("index", "train-embedder", "--traces", str(tmp_path), "--out", str(tmp_path / "m"))
    assert code == 2 and says in " ".join(out.split()), out
