"""A Merkle tree over a file tree: leaf = a file's content hash, directory = hash of its
children's names and hashes, root = the identity of the whole tree.

Two trees are compared top down, descending only into directories whose hashes differ, so
the cost of a diff follows the size of the change, not of the repository; an update
re-hashes only the directories on the changed file's path (lazily, on the next read). The
root hash is the key under which a base index is shared: workspaces made from one snapshot
have the same root until they change something.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping


class _Dir:
    __slots__ = ("children", "digest")

    def __init__(self) -> None:
        self.children: dict[str, _Dir | str] = {}  # name -> subdirectory or file hash
        self.digest: str | None = None  # None: stale, recomputed on demand

    def hash(self) -> str:
        if self.digest is None:
            h = hashlib.blake2b(digest_size=16)
            for name in sorted(self.children):
                child = self.children[name]
                kind, value = ("d", child.hash()) if isinstance(child, _Dir) else ("f", child)
                h.update(f"{kind}\0{name}\0{value}\n".encode("utf-8", "surrogatepass"))
            self.digest = h.hexdigest()
        return self.digest


class MerkleTree:
    """File hashes by workspace-relative path, with directory hashes kept up to date."""

    def __init__(self, files: Mapping[str, str] | None = None):
        self._root = _Dir()
        self.files: dict[str, str] = {}
        for path, digest in (files or {}).items():
            self.set(path, digest)

    @property
    def root(self) -> str:
        return self._root.hash()

    def set(self, path: str, digest: str | None) -> None:
        """Record a file's new content hash (None: the file is gone)."""
        parts = path.split("/")
        node, trail = self._root, [self._root]
        for i, name in enumerate(parts[:-1]):
            child = node.children.get(name)
            if not isinstance(child, _Dir):
                if digest is None:
                    return
                self.files.pop("/".join(parts[: i + 1]), None)  # a file replaced by a directory
                child = node.children[name] = _Dir()
            node = child
            trail.append(node)
        if digest is None:
            if not isinstance(node.children.get(parts[-1]), _Dir):  # a directory now stands there: keep it
                node.children.pop(parts[-1], None)
            self.files.pop(path, None)
            for parent, name in zip(reversed(trail[:-1]), reversed(parts[:-1]), strict=True):
                if parent.children[name].children:  # type: ignore[union-attr]
                    break
                del parent.children[name]  # drop directories left empty
        else:
            replaced = node.children.get(parts[-1])
            if isinstance(replaced, _Dir):  # a directory replaced by a file: its files are gone too
                for gone in _files_under(replaced, path + "/"):
                    self.files.pop(gone, None)
            node.children[parts[-1]] = digest
            self.files[path] = digest
        for d in trail:
            d.digest = None

    def diff(self, other: MerkleTree) -> dict[str, str | None]:
        """The files of `other` that differ from this tree: path -> other's hash (None: not in other)."""
        out: dict[str, str | None] = {}
        for path, ours, theirs in _walk(self._root, other._root, ""):
            if ours != theirs:
                out[path] = theirs
        return out


def _files_under(d: _Dir, prefix: str) -> Iterator[str]:
    for name, child in d.children.items():
        if isinstance(child, _Dir):
            yield from _files_under(child, prefix + name + "/")
        else:
            yield prefix + name


def _walk(a: _Dir | None, b: _Dir | None, prefix: str) -> Iterator[tuple[str, str | None, str | None]]:
    """(path, hash in a, hash in b) for every file under directories whose hashes differ."""
    if a is not None and b is not None and a.hash() == b.hash():
        return
    names = set(a.children if a else ()) | set(b.children if b else ())
    for name in sorted(names):
        x = a.children.get(name) if a else None
        y = b.children.get(name) if b else None
        path = prefix + name
        xd, yd = isinstance(x, _Dir), isinstance(y, _Dir)
        if xd or yd:
            yield from _walk(x if xd else None, y if yd else None, path + "/")  # type: ignore[arg-type]
        if not xd or not yd:
            fx, fy = (None if xd else x), (None if yd else y)
            if fx is not None or fy is not None:
                yield path, fx, fy  # type: ignore[misc]
