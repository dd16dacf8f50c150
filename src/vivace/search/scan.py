"""Which files the index covers, with their stats, hashes and texts: one scan of a tree.

The same source serves two callers: imported, it scans a host directory (`vivace index
build --repo DIR`, benchmarks); sent as source to `python3 -c SOURCE ARGS_JSON` inside a
workspace, it scans the workspace with one exec, so local, isolated and remote (HTTP)
workspaces are indexed the same way. It must therefore run on any python3 with the standard
library alone.

Files are those the search tools see: hidden files and directories and symlinks are skipped;
in a git repository, the files git lists (tracked, and untracked but not ignored: a tracked
`build/` or `vendor/` is indexed; a submodule's or nested repository's files as its own git
lists them), else every file outside vendored dependency and build folders (SKIP_DIRS);
binary (a NUL byte in the first 8 KiB), oversized and unreadable files are counted but not
indexed, and so are files past `max_files`. Text is UTF-8, UTF-16 with a byte-order mark, or else
Latin-1 (a legacy 8-bit file's words stay words; read as UTF-8 they were cut by U+FFFD). git runs with `safe.directory=*` (the listing
only reads), so a repository owned by another user still honours its .gitignore; where git
fails in a repository all the same, a warning is logged and the walk's rules apply. Not
guaranteed: a file that changes during a scan may be reported with its old stat and new text
(the next scan sees the stat change and reads it again).
"""

import base64
import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import time
import zlib

SKIP_DIRS = {"node_modules", "__pycache__", "venv", "site-packages", "target", "dist", "build", "vendor"}  # no git
GIT_LIST = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]
log = logging.getLogger("vivace.search.scan")  # stdlib only: inside a workspace it prints to stderr
_warned = set()  # roots whose git failure was already logged


def text_hash(text):
    """Content hash of an indexed file's text (also the Merkle tree's leaf hash)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def in_git_repo(root):
    """Whether `root` is inside a git work tree (a .git directory or file above it)."""
    d = os.path.abspath(root)
    while True:
        if os.path.exists(os.path.join(d, ".git")):
            return True
        parent = os.path.dirname(d)
        if parent == d:
            return False
        d = parent


def git_files(root):
    """The paths git lists under `root` (tracked, and untracked but not ignored); None when git
    cannot list them (not a repository, no git, or git refused)."""
    try:
        r = subprocess.run(["git", "-c", "safe.directory=*", "-C", root, *GIT_LIST], capture_output=True)
    except OSError as e:
        r = subprocess.CompletedProcess([], 127, b"", str(e).encode())
    if r.returncode == 0 and r.stdout:
        return [p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    if r.returncode != 0 and root not in _warned and in_git_repo(root):
        _warned.add(root)  # once per process: a long-lived index rescans on every query
        why = r.stderr.decode("utf-8", "replace").strip().split("\n")[0][:300]
        log.warning("git could not list the files of %s (%s); indexing without .gitignore", root, why)
    return None


def candidates(root):
    """(relative path, lstat) of the regular files under `root` that search may index, sorted."""
    return sorted(_listed(root, ""), key=lambda e: e[0].split("/"))


def _listed(root, sub):
    """(path, lstat) of the files under root/sub, unsorted. git lists a submodule or a nested repository
    as one directory entry (a gitlink, or "dir/"), so such a directory is listed by its own git."""
    top = os.path.join(root, sub) if sub else root
    found = git_files(top)
    if found is None:
        found = []
        for d, dirs, names in os.walk(top):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x not in SKIP_DIRS]
            rel = os.path.relpath(d, top)
            found += [n if rel == "." else rel + "/" + n for n in names]
    out = []
    for p in found:
        p = os.path.normpath(os.path.join(sub, p))
        if p == sub or any(c.startswith(".") for c in p.split("/")):
            continue  # hidden, or an empty (uninitialised) submodule listing itself
        try:
            st = os.lstat(os.path.join(root, p))
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            out += _listed(root, p)
        elif stat.S_ISREG(st.st_mode):  # not a symlink or device
            out.append((p, st))
    return out


def read_text(full, max_bytes):
    """The file's text, or None when it is binary, oversized or unreadable."""
    try:
        with open(full, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError:
        return None
    if len(data) > max_bytes:
        return None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 with its byte-order mark (Windows tools write it)
        return data.decode("utf-16", "replace")
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # legacy 8-bit text: as Latin-1, each byte one character, so "café" stays a word
        return data.decode("latin-1")


def scan(
    root=".", since_ns=None, hashes=False, max_files=100_000, max_bytes=1_000_000, budget=150_000, offset=0, limit=None
):
    """One pass over `root`: {"clock", "total", "files": [[path, size, mtime_ns, hash]], "texts",
    "skipped", "over_max_files"}. `hashes`: hash every file's text (a workspace's first scan); ""
    marks a file that is not indexable, null one that was not read. `since_ns`: also return the
    texts of files modified at or after it, within `budget` characters, so an edit since the last
    scan costs no second exec. `offset`/`limit` page through the candidates (`total` of them, the
    first `max_files`; "over_max_files" counts those left out)."""
    clock = time.time_ns()
    files, texts, skipped, used = [], {}, 0, 0
    listed = candidates(root)
    found = listed[:max_files]
    for p, st in found[offset : None if limit is None else offset + limit]:
        full = os.path.join(root, p)
        digest = None
        recent = since_ns is not None and st.st_mtime_ns >= since_ns
        if st.st_size > max_bytes:
            digest, recent = "", False
        elif hashes or recent:
            text = read_text(full, max_bytes)
            if text is None:
                digest, recent = "", False
            elif hashes:
                digest = text_hash(text)
            if recent and used + len(text) <= budget:
                texts[p], used = text, used + len(text)
        skipped += digest == ""
        files.append([p, st.st_size, st.st_mtime_ns, digest])
    over = len(listed) - len(found)
    return dict(clock=clock, total=len(found), files=files, texts=texts, skipped=skipped, over_max_files=over)


def read_many(root, paths, max_bytes=1_000_000, budget=150_000):
    """Texts of `paths` (None: binary, oversized, unreadable or gone) until `budget` characters
    are used: {"texts", "rest"} where rest are the paths left for the next call."""
    texts, used = {}, 0
    for i, p in enumerate(paths):
        text = read_text(os.path.join(root, p), max_bytes)
        if texts and text is not None and used + len(text) > budget:
            return {"texts": texts, "rest": paths[i:]}
        texts[p], used = text, used + len(text or "")
    return {"texts": texts, "rest": []}


def encode(obj):
    return base64.b64encode(zlib.compress(json.dumps(obj).encode("utf-8", "surrogatepass"), 6)).decode()


def decode(blob):
    return json.loads(zlib.decompress(base64.b64decode(blob)).decode("utf-8", "surrogatepass"))


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    if args.pop("mode") == "read":
        print(encode(read_many(".", sys.argv[2:], **args)))
    else:
        print(encode(scan(".", **args)))
