"""Which tree-sitter grammar parses which file, and which nodes are definitions.

Grammars come from the per-language wheels (`tree-sitter-python`, `-javascript`,
`-typescript`, `-go`, `-rust`, `-java`) and are loaded on first use; a grammar that is not
installed (or fails to load) makes its files fall back to line windows, with one warning.
Adding a language is one row in LANGUAGES.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Language:
    name: str
    module: str  # the grammar wheel's module
    loader: str  # its function returning the language pointer
    definitions: frozenset[str]  # node types that are functions, classes, methods, types
    containers: frozenset[str] = frozenset()  # definitions whose members are chunked on their own


_JS_DEFS = {
    "function_declaration", "generator_function_declaration", "class_declaration", "method_definition",
    "lexical_declaration", "variable_declaration", "interface_declaration", "type_alias_declaration",
    "enum_declaration", "abstract_class_declaration", "module", "internal_module",
}  # fmt: skip
_JS_CONTAINERS = {"class_declaration", "abstract_class_declaration", "interface_declaration", "module"}

LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in [
        Language(
            "python", "tree_sitter_python", "language",
            frozenset({"function_definition", "class_definition", "decorated_definition"}),
            frozenset({"class_definition"}),
        ),
        Language("javascript", "tree_sitter_javascript", "language", frozenset(_JS_DEFS), frozenset(_JS_CONTAINERS)),
        Language("typescript", "tree_sitter_typescript", "language_typescript", frozenset(_JS_DEFS),
                 frozenset(_JS_CONTAINERS)),
        Language("tsx", "tree_sitter_typescript", "language_tsx", frozenset(_JS_DEFS), frozenset(_JS_CONTAINERS)),
        Language(
            "go", "tree_sitter_go", "language",
            frozenset({"function_declaration", "method_declaration", "type_declaration"}),
        ),
        Language(
            "rust", "tree_sitter_rust", "language",
            frozenset({"function_item", "impl_item", "struct_item", "enum_item", "trait_item", "mod_item",
                       "macro_definition", "function_signature_item"}),
            frozenset({"impl_item", "trait_item", "mod_item"}),
        ),
        Language(
            "java", "tree_sitter_java", "language",
            frozenset({"class_declaration", "interface_declaration", "enum_declaration", "record_declaration",
                       "method_declaration", "constructor_declaration"}),
            frozenset({"class_declaration", "interface_declaration", "enum_declaration", "record_declaration"}),
        ),
    ]
}  # fmt: skip

EXTENSIONS = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java",
}  # fmt: skip


def language_of(path: str) -> Language | None:
    dot = path.rfind(".")
    name = EXTENSIONS.get(path[dot:].lower()) if dot > path.rfind("/") else None
    return LANGUAGES.get(name) if name else None


_local = threading.local()  # tree-sitter parsers are not thread-safe: one per thread and language


@cache
def _grammar(name: str) -> Any:
    lang = LANGUAGES[name]
    try:
        import tree_sitter

        return tree_sitter.Language(getattr(importlib.import_module(lang.module), lang.loader)())
    except Exception as e:  # missing wheel, ABI mismatch: index these files as plain lines
        log.warning("no tree-sitter grammar for %s (%s); its files are chunked by lines", name, e)
        return None


def parser_for(name: str) -> Any:
    """This thread's tree_sitter.Parser for LANGUAGES[name], or None when its grammar cannot be loaded."""
    parsers = _local.__dict__.setdefault("parsers", {})
    if name not in parsers:
        grammar = _grammar(name)
        if grammar is None:
            parsers[name] = None
        else:
            import tree_sitter

            parsers[name] = tree_sitter.Parser(grammar)
    return parsers[name]
