"""The file walker the search tools run INSIDE a workspace: `python3 -c SOURCE ARGS_JSON [PATHS...]`.

It is never imported by vivace: search.py reads this file and sends its source, so it must run
on any python3 with the standard library alone. Modes: grep (content/files/count, printing
exactly what ripgrep prints for the same inputs), glob, list (text-file candidates with size
and mtime) and read (file contents, zlib+base64, in batches under the sandbox's output cap).

Files are those rg would search: hidden files and directories, symlinks and binary files are
skipped, and in a git repository .gitignore is honoured through `git ls-files`. Where git cannot
answer (no git binary, or a worktree or submodule whose .git file points outside the workspace)
the walk reads .gitignore files itself (`Ignores`: the common syntax, plus .git/info/exclude;
not core.excludesFile). As with rg, a path named explicitly is searched even when it is ignored
(rules still apply below it), and a symlinked directory named explicitly is followed when it
stays inside the workspace.
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


def git_ls_files(root, own_repo=False):
    """The files git would show under root (tracked and not ignored); None outside a repository or without git.
    `own_repo`: root is the top of its own repository (a submodule or a nested one), so ask its git."""
    where = ["-C", root] if own_repo else []
    argv = [
        "git",
        *where,
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
        "--",
        "." if own_repo else root,
    ]
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
    names = [p for p in r.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    return [os.path.join(root, p) for p in names] if own_repo else names


def outside(path):
    """True when path resolves (through symlinks) to somewhere outside the workspace root (the cwd)."""
    top = os.path.realpath(".")
    real = os.path.realpath(path)
    return real != top and not real.startswith(top.rstrip("/") + "/")


def files(root, hidden=False, own_repo=False):
    """The files to search under root; `hidden`: names starting with "." too (never .git's); `own_repo`: see
    git_ls_files."""
    if os.path.isfile(root):
        return [root]
    real = os.path.relpath(os.path.realpath(root), os.path.realpath("."))
    if real != os.path.normpath(root):  # reached through a symlinked directory: list the target, keep root's spelling
        return [os.path.join(root, os.path.relpath(p, real)) for p in files(real, hidden)]
    found = git_ls_files(root, own_repo)
    if not found:  # git unusable, or root ignored by git (named explicitly, so searched as rg does), or empty
        found = walk(root, hidden)
    out = []
    for p in found:
        p = os.path.normpath(p)
        rel = p if root == "." else os.path.relpath(p, root)
        parts = rel.split("/")
        if ".git" in parts or (not hidden and any(c.startswith(".") for c in parts)) or os.path.islink(p):
            continue
        if os.path.isdir(p):  # a submodule or nested repository, which git lists as one entry: its own files
            if p != os.path.normpath(root):  # (an empty, uninitialised submodule lists itself)
                out += files(p, hidden, own_repo=os.path.exists(os.path.join(p, ".git")))
        elif os.path.isfile(p):
            out.append(p)
    return sorted(out, key=lambda p: p.split("/"))


STAR, DSTAR, DIRS = "[^/]*", ".*", "(?:.*/)?"  # `*`, `**` and `**/` as regex


def glob_tokens(pat, gitignore=False):
    """A glob (`**`, `*`, `?`, `[...]`, `{a,b}`) or, with `gitignore`, one .gitignore pattern (no leading '!'
    or trailing '/'; `\\` escapes; `**` only as a whole segment) as tokens: regexes for one character,
    STAR, DSTAR or DIRS, and a list of token lists for `{a,b}`."""
    i, out = 0, []
    while i < len(pat):
        c = pat[i]
        whole = (i == 0 or pat[i - 1] == "/") and pat[i + 2 : i + 3] in ("/", "")
        if pat.startswith("**", i) and (whole or not gitignore):
            slash = pat[i + 2 : i + 3] == "/"
            wildcard(out, DIRS if slash else DSTAR)
            i += 3 if slash else 2
            continue
        j = -1
        if c == "[":
            j = pat.find("]", i + (3 if pat[i + 1 : i + 2] in ("!", "^") else 2))
        elif c == "{" and not gitignore:
            j = pat.find("}", i)
        if c == "\\" and gitignore and i + 1 < len(pat):
            out.append(re.escape(pat[i + 1]))
            i += 1
        elif c == "*":
            wildcard(out, STAR)
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and j > 0:
            body = pat[i + 1 : j]
            out.append("[" + ("^" + body[1:] if body[:1] in ("!", "^") else body).replace("\\", "\\\\") + "]")
            i = j
        elif c == "{" and j > 0:
            out.append([glob_tokens(x) for x in pat[i + 1 : j].split(",")])
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return out


def wildcard(out, tok):
    """Append a wildcard, merged with one just before it (`***`, `**/**/`) into one matching the same paths:
    each wildcard in a row multiplies the ways a regex can split a name, and re tries them all."""
    last = out[-1] if out else None
    if last == DSTAR and tok in (STAR, DSTAR, DIRS) or last == tok:
        return
    if tok == DSTAR and last in (STAR, DIRS):
        out[-1] = DSTAR
    else:
        out.append(tok)


def tokens_re(toks):
    return "".join("(?:" + "|".join(map(tokens_re, t)) + ")" if isinstance(t, list) else t for t in toks)


def pattern_re(pat, gitignore=False):
    """A regex matching a whole path for a glob or .gitignore pattern (see glob_tokens)."""
    return tokens_re(glob_tokens(pat, gitignore))


def branches(toks):
    """How many places in toks a backtracking regex can choose among several ways (wildcards, `{a,b}`)."""
    return sum(1 + sum(map(branches, t)) if isinstance(t, list) else t in (STAR, DSTAR, DIRS) for t in toks)


def compile_glob(pat, gitignore=False, flags=0):
    """`fullmatch(path) -> bool` for a glob or .gitignore pattern. re backtracks through every way to split a
    path among the wildcards (28 `*` took minutes on one name; `{,}` doubles per group), so a pattern with
    more than two choice points runs on a Thompson NFA instead: time linear in the path for a given pattern."""
    toks = glob_tokens(pat, gitignore)
    if branches(toks) <= 2:
        rx = re.compile(tokens_re(toks), flags)
        return lambda p: rx.fullmatch(p) is not None
    return Nfa(toks, flags).fullmatch


class Nfa:
    """A Thompson NFA for glob tokens, run over all its states at once (no backtracking); the sets of states
    met are cached per character, as a lazily built DFA."""

    def __init__(self, toks, flags=0):
        self.flags, self.ops, self.cache = flags, [], {}  # ops: ("c", one-char test) | ("split", a, b) | ("jmp", a)
        self.emit(toks)
        self.start = self.closure([0])

    def char(self, rx):
        self.ops.append(("c", re.compile(rx, self.flags).fullmatch))

    def emit(self, toks):
        ops = self.ops
        for t in toks:
            at = len(ops)
            if isinstance(t, list):  # split to each alternative; each jumps past the last
                jumps = []
                for k, alt in enumerate(t):
                    split = len(ops)
                    if k < len(t) - 1:
                        ops.append(None)
                    self.emit(alt)
                    if k < len(t) - 1:
                        jumps.append(len(ops))
                        ops.append(None)
                        ops[split] = ("split", split + 1, len(ops))
                for j in jumps:
                    ops[j] = ("jmp", len(ops))
            elif t in (STAR, DSTAR):  # at: split(at+1, at+3); at+1: one char; at+2: jmp at
                ops.append(("split", at + 1, at + 3))
                self.char("[^/]" if t == STAR else ".")
                ops.append(("jmp", at))
            elif t == DIRS:  # (?:.*/)?
                ops.append(("split", at + 1, at + 5))
                ops.append(("split", at + 2, at + 4))
                self.char(".")
                ops.append(("jmp", at + 1))
                self.char("/")
            else:
                self.char(t)

    def closure(self, pcs):
        seen, todo = set(), list(pcs)
        while todo:
            pc = todo.pop()
            if pc in seen:
                continue
            seen.add(pc)
            op = self.ops[pc] if pc < len(self.ops) else None  # len(ops): the match state
            if op and op[0] == "split":
                todo += op[1:]
            elif op and op[0] == "jmp":
                todo.append(op[1])
        return frozenset(seen)

    def fullmatch(self, s):
        states = self.start
        for ch in s:
            key = (states, ch)
            nxt = self.cache.get(key)
            if nxt is None:
                if len(self.cache) > 100_000:
                    self.cache.clear()
                step = [
                    pc + 1 for pc in states if pc < len(self.ops) and self.ops[pc][0] == "c" and self.ops[pc][1](ch)
                ]
                nxt = self.cache[key] = self.closure(step)
            states = nxt
            if not states:
                return False
        return len(self.ops) in states


def ignore_rules(path, base):
    """[(base, regex, negated, dir_only, anchored)] for the ignore file at path, whose patterns are relative to base."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().split("\n")
    except OSError:
        return []
    rules = []
    for line in lines:
        line = line.rstrip("\r")
        stripped = line.rstrip(" ")
        if stripped.endswith("\\") and len(stripped) < len(line):
            stripped += " "  # an escaped trailing space is kept
        line = stripped
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line[1:] if line.startswith(("\\#", "\\!")) else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        try:
            rx = compile_glob(line.lstrip("/"), gitignore=True, flags=re.DOTALL)
        except re.error:
            continue
        rules.append((base, rx, negated, dir_only, anchored))
    return rules


class Ignores:
    """.gitignore rules by directory, read as the walk reaches each directory (rg's order: deeper files
    and later lines win). Rules apply only where a .git exists in the directory or one above it."""

    def __init__(self):
        self.rules, self.git = {}, {}

    def of(self, d):
        d = os.path.normpath(d)
        if d not in self.rules:
            parent = os.path.dirname(d) if d != "." and "/" in d else "."
            rules, git = ([], False) if d == "." else (self.of(parent), self.git[parent])
            git = git or os.path.exists(os.path.join(d, ".git"))
            if d == "." and os.path.isdir(".git"):
                rules = ignore_rules(os.path.join(".git", "info", "exclude"), ".")
            self.rules[d], self.git[d] = rules + ignore_rules(os.path.join(d, ".gitignore"), d), git
        return self.rules[d]

    def ignored(self, d, name, is_dir):
        rules = self.of(d)
        if not self.git[os.path.normpath(d)]:
            return False
        path = os.path.normpath(os.path.join(d, name))
        hit = False
        for base, rx, negated, dir_only, anchored in rules:
            if dir_only and not is_dir:
                continue
            rel = path if base == "." else path[len(base) + 1 :] if path.startswith(base + "/") else None
            if rel is not None and rx(rel if anchored else name):
                hit = not negated
        return hit


def walk(root, hidden=False):
    """Files under root with hidden directories skipped (`hidden`: only .git) and .gitignore honoured (root
    itself is never ignored)."""
    ign, found = Ignores(), []
    for d, dirs, names in os.walk(root):
        dirs[:] = [
            x for x in dirs if (x != ".git" if hidden else not x.startswith(".")) and not ign.ignored(d, x, True)
        ]
        found += [os.path.join(d, n) for n in names if not ign.ignored(d, n, False)]  # os.walk puts dirs in dirs
    return found


def matcher(pat):
    if not pat:
        return lambda p: True
    pat = pat[2:] if pat.startswith("./") else pat.lstrip("/")
    fullmatch = compile_glob(pat)
    return lambda p: fullmatch(p if "/" in pat else p.rsplit("/", 1)[-1])


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
        # As rg --crlf: `$` matches before a \r\n ending (the \r is still printed; search.py strips it).
        hits = [n for n, line in enumerate(lines) if rx.search(line[:-1] if line.endswith("\r") else line)]
        if not hits:
            continue
        if mode != "content":
            print(p if mode == "files" else f"{p}:{len(hits)}", flush=True)
            any_out = True
            continue
        shown = sorted({j for n in hits for j in range(max(0, n - before), min(len(lines), n + after + 1))})
        hit, prev = set(hits), None
        for j in shown:
            if (before or after) and (any_out if prev is None else j != prev + 1):
                print("--")
            print(f"{p}{':' if j in hit else '-'}{j + 1}{':' if j in hit else '-'}{cut(lines[j])}")
            prev, any_out = j, True
        sys.stdout.flush()  # a search killed by its timeout still hands back the files done so far
    sys.exit(0 if any_out else 1)


def cut(line):
    """As rg --max-columns N --max-columns-preview: a line over N bytes keeps its first N."""
    raw = line.encode("utf-8", "surrogateescape")
    if len(raw) <= a["max_columns"]:
        return line
    return raw[: a["max_columns"]].decode("utf-8", "surrogateescape") + " [... omitted end of long line]"


def name_shown(p):
    """A path as the tools show a name that is not UTF-8 (tools/base.py `shown`): each such byte as \\xNN,
    the spelling path arguments take back."""
    return p.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def glob():
    keep, root, matched = matcher(a["glob"]), a["path"], 0
    # Hidden files only when the pattern names one (".env*", ".github/**/*.yml"): asked for, never noise.
    hidden = any(c.startswith(".") and c not in (".", "..") for c in a["glob"].split("/"))
    for p in files(root, hidden):
        if keep(p if root == "." or os.path.isfile(root) else os.path.relpath(p, root)):
            if matched < a.get("limit", float("inf")):  # the rest only counted: 50,000 paths overflowed the output
                print(name_shown(p))
            matched += 1
    print(f"\0{matched}")  # the count, on a line no path can be (a name holds no NUL)
    if not matched and os.path.isfile(root):
        print(root + ": is a file", file=sys.stderr)  # search.py says so rather than "no files match"


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
    if a["mode"] in ("content", "files", "count", "glob") and a["path"] != ".":
        if not os.path.exists(a["path"]):
            sys.exit(print(a["path"] + ": No such file or directory (os error 2)", file=sys.stderr) or 2)
        if outside(a["path"]):
            sys.exit(print(a["path"] + ": is outside the workspace", file=sys.stderr) or 2)
    try:
        {"glob": glob, "list": listing, "read": read}.get(a["mode"], grep)()
    except Exception as e:  # exit 1 means "no matches": a crash must not read as one
        sys.exit(print(f"walker failed: {type(e).__name__}: {e}", file=sys.stderr) or 3)
