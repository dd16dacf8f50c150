"""The file walker the search tools run INSIDE a workspace: `python3 -c SOURCE ARGS_JSON [PATHS...]`.

It is never imported by vivace: search.py reads this file and sends its source, so it must run
on any python3 with the standard library alone. Modes: grep (content/files/count, printing
exactly what ripgrep prints for the same inputs), glob, list (text-file candidates with size
and mtime) and read (file contents, zlib+base64, in batches under the sandbox's output cap).

Files are those rg would search: hidden files and directories, symlinks and binary files are
skipped, and in a git repository .gitignore is honoured through `git ls-files`.
"""

import base64
import json
import os
import re
import subprocess
import sys
import time
import zlib

a: dict = {}  # the arguments (ARGS_JSON), set by __main__


def git_ls_files(root):
    """The files git would show under root (tracked and not ignored); None outside a repository or without git."""
    argv = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", root]
    # fork fails with EAGAIN while the machine is briefly out of processes (seen under a test
    # suite's load); git has not run then, so wait and try again rather than fail the search.
    for delay in (0.05, 0.2, 0.8, None):
        try:
            r = subprocess.run(argv, capture_output=True)
            break
        except FileNotFoundError:
            return None
        except BlockingIOError:
            if delay is None:
                raise
            time.sleep(delay)
    if r.returncode != 0:
        return None
    return [p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def files(root):
    if os.path.isfile(root):
        return [root]
    found = git_ls_files(root)
    if found is None:
        found = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            found += [os.path.join(d, n) for n in names]
    out = []
    for p in found:
        p = os.path.normpath(p)
        rel = p if root == "." else os.path.relpath(p, root)
        if any(c.startswith(".") for c in rel.split("/")) or os.path.islink(p) or not os.path.isfile(p):
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.split("/"))


def globre(pat):
    i, out = 0, ""
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
            continue
        if pat.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        j = pat.find("]" if c == "[" else "}", i + 2 if c == "[" else i) if c in "[{" else -1
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[" and j > 0:
            body = pat[i + 1 : j]
            out += "[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]"
            i = j
        elif c == "{" and j > 0:
            out += "(?:" + "|".join(globre(x) for x in pat[i + 1 : j].split(",")) + ")"
            i = j
        else:
            out += re.escape(c)
        i += 1
    return out


def matcher(pat):
    if not pat:
        return lambda p: True
    pat = pat[2:] if pat.startswith("./") else pat.lstrip("/")
    rx = re.compile(globre(pat))
    return lambda p: bool(rx.fullmatch(p if "/" in pat else p.rsplit("/", 1)[-1]))


def text_of(p):
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return None if b"\0" in data else data.decode("utf-8", "replace")


def grep():
    try:
        rx = re.compile(a["pattern"], re.IGNORECASE if a["ignore_case"] else 0)
    except re.error as e:
        sys.exit(print("regex parse error: " + str(e), file=sys.stderr) or 2)
    keep = matcher(None if os.path.isfile(a["path"]) else a["glob"])  # rg filters walked files only
    before, after, mode, any_out = a["before"], a["after"], a["mode"], False
    for p in files(a["path"]):
        text = text_of(p) if keep(p) else None
        lines = text.split("\n") if text else []
        if lines and lines[-1] == "":
            lines.pop()
        hits = [n for n, line in enumerate(lines) if rx.search(line)]
        if not hits:
            continue
        if mode != "content":
            print(p if mode == "files" else f"{p}:{len(hits)}")
            any_out = True
            continue
        shown = sorted({j for n in hits for j in range(max(0, n - before), min(len(lines), n + after + 1))})
        hit, prev = set(hits), None
        for j in shown:
            if (before or after) and (any_out if prev is None else j != prev + 1):
                print("--")
            print(f"{p}{':' if j in hit else '-'}{j + 1}{':' if j in hit else '-'}{lines[j]}")
            prev, any_out = j, True
    sys.exit(0 if any_out else 1)


def glob():
    keep, root = matcher(a["glob"]), a["path"]
    for p in files(root):
        if keep(p if root == "." or os.path.isfile(root) else os.path.relpath(p, root)):
            print(p)


def emit(obj):
    print(base64.b64encode(zlib.compress(json.dumps(obj).encode("utf-8", "surrogateescape"))).decode())


def listing():
    out = []
    for p in files("."):
        st = os.stat(p)
        if st.st_size <= a["max_bytes"]:
            out.append([p, st.st_size, st.st_mtime_ns])
    emit(out[: a["max_files"]])


def read():
    got, rest, used = {}, [], 0
    for i, p in enumerate(sys.argv[2:]):
        text = text_of(p)
        blob = None if text is None else base64.b64encode(zlib.compress(text.encode("utf-8", "replace"))).decode()
        if blob is not None and len(blob) > a["budget"]:
            blob = None
        if blob is not None and used + len(blob) > a["budget"]:
            rest = sys.argv[2 + i :]
            break
        got[p], used = blob, used + len(blob or "") + len(p)
    print(json.dumps({"files": got, "rest": rest}))


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    sys.stdout.reconfigure(encoding="utf-8", errors="surrogateescape")
    if a["mode"] in ("content", "files", "count") and a["path"] != "." and not os.path.exists(a["path"]):
        sys.exit(print(a["path"] + ": No such file or directory (os error 2)", file=sys.stderr) or 2)
    try:
        {"glob": glob, "list": listing, "read": read}.get(a["mode"], grep)()
    except Exception as e:  # exit 1 means "no matches": a crash must not read as one
        sys.exit(print(f"walker failed: {type(e).__name__}: {e}", file=sys.stderr) or 3)
