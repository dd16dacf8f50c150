"""Lexical retrieval: code-aware tokens and BM25 (bm25s) over chunk text and paths.

Identifiers count whole and split into words (`computeTotalPrice` -> computetotalprice,
compute, total, price), so a query in words finds code in identifiers and the reverse.

A base index is built once with bm25s. Documents added later (a workspace's changed files)
are scored with the same formula and the base's statistics (document frequencies, average
length, corpus size), so their scores compare with the base's without re-indexing it; a term
the base never saw gets the highest IDF, which is what makes a new identifier findable at once.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

# Words in any script (Python's \w: letters, digits, underscore), not ASCII only: an identifier such as
# `grüße_sentinel` came out as "gr" and "e_sentinel", and Cyrillic or CJK text as nothing at all.
_IDENT = re.compile(r"[^\W\d]\w*|\d+")
_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")  # camelCase, split in ASCII words
# Scripts written without spaces (kana, CJK ideographs, hangul): a run of them is one \w word, so each
# also counts as its overlapping character pairs, which a query's words then match.
_UNSPACED = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]{2,}")
K1, B = 1.5, 0.75  # bm25s' defaults (method "lucene")


def tokenize(text: str) -> list[str]:
    """Identifiers whole and split (snake_case, camelCase), lowercased; one-letter tokens dropped."""
    out = []
    for word in _IDENT.findall(text):
        if len(word) > 1:
            out.append(word.lower())
        parts = _PARTS.findall(word) if word.isascii() else _parts(word)
        if len(parts) > 1:
            out += [p.lower() for p in parts if len(p) > 1]
    return out


def _parts(word: str) -> list[str]:
    """The parts of a word that is not ASCII: its snake_case pieces (each ASCII piece split as camelCase),
    and the character pairs of any run of an unspaced script."""
    parts: list[str] = []
    pieces = word.split("_")
    for piece in pieces:
        if piece.isascii():
            parts += _PARTS.findall(piece)
        elif len(pieces) > 1:  # a piece of a longer name; the word itself is already a token
            parts.append(piece)
        for run in _UNSPACED.findall(piece):
            parts += [run[i : i + 2] for i in range(len(run) - 1)]
    return parts


def import_bm25s():
    """bm25s, imported so that it leaves the GPU alone. Where JAX is installed, importing bm25s runs a JAX
    top-k, and JAX's first operation takes 75% of the GPU's memory (its preallocation): on a GPU machine
    whose image has JAX, the first episode that searched left the engine and trainer out of memory.
    Its top-k over an index's chunks needs no GPU; a JAX_PLATFORMS the user set is kept."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import bm25s  # deferred: importing it costs ~0.3 s

    return bm25s


class LexicalIndex:
    """BM25 over a fixed list of documents (token lists), plus scoring of extra documents."""

    def __init__(self, docs: Sequence[list[str]]):
        bm25s = import_bm25s()
        self.n = len(docs)
        self.df: Counter[str] = Counter(t for doc in docs for t in set(doc))
        self.avgdl = sum(len(d) for d in docs) / self.n if self.n else 1.0
        self.bm25 = bm25s.BM25(k1=K1, b=B, method="lucene")
        if self.n:
            self.bm25.index([d or [""] for d in docs], show_progress=False)

    def scores(self, query: list[str]) -> np.ndarray:
        """BM25 score of every base document (n,)."""
        if not self.n or not query:
            return np.zeros(self.n, np.float32)
        known = [t for t in query if t in self.df]
        return self.bm25.get_scores(known) if known else np.zeros(self.n, np.float32)

    def score_docs(self, query: list[str], docs: Sequence[list[str]] | Postings) -> np.ndarray:
        """BM25 scores of documents outside the index, with the index's statistics (pass
        `Postings` to score many documents often: they are indexed once)."""
        postings = docs if isinstance(docs, Postings) else Postings(docs)
        out = np.zeros(postings.n, np.float32)
        norm = K1 * (1 - B + B * postings.lengths / self.avgdl)
        for term, count in Counter(query).items():
            hit = postings.terms.get(term)
            if hit is None:
                continue
            ids, tf = hit
            df = self.df.get(term, 0)
            idf = math.log(1 + (self.n - df + 0.5) / (df + 0.5))
            out[ids] += count * idf * tf / (tf + norm[ids])
        return out


class Postings:
    """An inverted index of a few documents (a workspace's overlay): term -> (doc ids, term counts)."""

    def __init__(self, docs: Sequence[list[str]]):
        self.n = len(docs)
        self.lengths = np.array([len(d) for d in docs], np.float32)
        grouped: dict[str, tuple[list[int], list[int]]] = {}
        for i, doc in enumerate(docs):
            for term, count in Counter(doc).items():
                ids, tfs = grouped.setdefault(term, ([], []))
                ids.append(i)
                tfs.append(count)
        self.terms = {t: (np.array(i, np.int64), np.array(c, np.float32)) for t, (i, c) in grouped.items()}
