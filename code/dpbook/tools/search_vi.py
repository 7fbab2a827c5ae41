"""Vietnamese search for the built book (loaded by ``dpbook.tools.sphinx_ext``).

Sphinx 7.4 has no Vietnamese search language: with ``language: vi`` its ``IndexBuilder``
(``sphinx/search/__init__.py``) falls back to ``SearchEnglish``, whose Porter stemmer and exact
word match make "bo nho dinh" find nothing and "nhớ" a different word from "nho". This module
gives Sphinx a search language ``vi`` (``app.add_search_language``) that

- folds every indexed word the way a reader types without a Vietnamese keyboard: Unicode NFD,
  combining marks dropped, đ → d, lower case (``fold``); the browser folds the query the same way,
  in the ``Stemmer`` that ``searchtools.js`` applies to each query word (``search_vi.js``, which
  Sphinx puts into ``language_data.js``, loaded by a script tag after ``searchtools.js``, so the
  search works from ``file://``);
- indexes each pair of neighbouring syllables as one more term (``bo_nho``), so a page that holds
  the whole phrase ranks above a page that only holds its syllables apart (Vietnamese words are
  several syllables: "bộ nhớ đỉnh" is three);
- makes the glossary's English terms and their Vietnamese glosses aliases of each other: a page
  that says "bộ nhớ đỉnh" is also found by "peak memory", one that says "peak memory" by
  "bộ nhớ đỉnh", and the glossary entry itself is an index entry under both names.

The gloss of a term is read from its definition as the glossary writes it: the words before the
first colon (``Bộ nhớ đỉnh: lượng bộ nhớ…``), at most six, without a comma or "của" (those
describe the term rather than name it), and what stands in parentheses in the term or the gloss
(``DataParallel (DP)``, ``Hook (hàm móc)``). A glossary entry written that way needs no markup.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.search import SearchLanguage

JS = Path(__file__).with_name("search_vi.js")
MAX_GLOSS_WORDS = 6
_WORD = re.compile(r"\w+")
_PARENS = re.compile(r"\(([^()]*)\)")
_NAME = re.compile(r"[\w .\-–]+")


def fold(text: str) -> str:
    """``text`` as the index keeps it: no diacritics, đ as d, lower case (NFC)."""
    if not isinstance(text, str):
        raise ValueError(f"fold cần một chuỗi (str), nhận được {type(text).__name__}")
    bare = "".join(c for c in unicodedata.normalize("NFD", text)
                   if unicodedata.category(c) != "Mn")
    return unicodedata.normalize("NFC", bare.replace("đ", "d").replace("Đ", "D").lower())


def words(text: str) -> list[str]:
    """The words of ``text`` in order, lower case, with their diacritics (NFC first, so text
    typed decomposed splits the same way)."""
    return _WORD.findall(unicodedata.normalize("NFC", text).lower())


class SearchVietnamese(SearchLanguage):
    """Sphinx search language ``vi``: folded words plus the pairs of neighbouring words."""

    lang = "vi"
    language_name = "Vietnamese"
    js_stemmer_code = JS.read_text(encoding="utf-8")

    def split(self, input: str) -> list[str]:  # noqa: A002 (Sphinx's signature)
        found = words(input)
        return found + [f"{a}_{b}" for a, b in zip(found, found[1:])]

    def stem(self, word: str) -> str:
        return fold(word)


def gloss_aliases(term: str, definition: str) -> list[str]:
    """The other names of glossary ``term`` whose definition starts with ``definition``."""
    names = [term, *_PARENS.findall(term)]
    head, colon, _ = definition.partition(":")
    head = " ".join(head.split())
    if colon and "," not in head and 0 < len(words(head)) <= 2 * MAX_GLOSS_WORDS:
        names += _PARENS.findall(head)  # "Hook (hàm móc): …"
        # A gloss names the term; "Tùy chọn của DDP: …" describes it ("của": "of").
        if "của" not in words(head) and len(words(head)) <= MAX_GLOSS_WORDS:
            names.append(head)
    out, seen = [], set()
    for name in names:
        name = " ".join(_PARENS.sub(" ", name).split()).strip(" .;")
        key = " ".join(words(name))
        if key and key not in seen and _NAME.fullmatch(name):
            seen.add(key)
            out.append(name)
    return out


def _read_glossary(app, doctree) -> None:
    """At read time: the names of every glossary term of the page (``env.dpbook_glossary``)."""
    entries = []
    for glossary in doctree.findall(addnodes.glossary):
        for item in glossary.findall(nodes.definition_list_item):
            terms = [t for t in item.children if isinstance(t, nodes.term)]
            definition = next((d for d in item.children if isinstance(d, nodes.definition)), None)
            first = next(iter(definition.findall(nodes.paragraph)), None) if definition else None
            text = first.astext() if first is not None else ""
            for term in terms:
                if term["ids"]:
                    entries.append((term["ids"][0], gloss_aliases(term.astext(), text)))
    env = app.env
    if not hasattr(env, "dpbook_glossary"):
        env.dpbook_glossary = {}
    if entries:
        env.dpbook_glossary[env.docname] = entries


def _purge(app, env, docname) -> None:
    getattr(env, "dpbook_glossary", {}).pop(docname, None)


def _merge(app, env, docnames, other) -> None:
    if not hasattr(env, "dpbook_glossary"):
        env.dpbook_glossary = {}
    for docname in docnames:
        if docname in getattr(other, "dpbook_glossary", {}):
            env.dpbook_glossary[docname] = other.dpbook_glossary[docname]


class search_aliases(nodes.Element):
    """Words the search index gets for a page and the reader never sees."""


def _skip(self, node) -> None:
    raise nodes.SkipNode


def aliases_for(text: str, groups) -> list[str]:
    """The names, from ``groups`` (lists of names of one term), that ``text`` lacks although it
    holds another name of the same term."""
    have = f" {' '.join(words(text))} "
    out = []
    for names in groups:
        present = [f" {' '.join(words(n))} " in have for n in names]
        if any(present):
            out += [n for n, p in zip(names, present) if not p]
    return out


def _add_aliases(app, doctree, docname) -> None:
    """At write time (HTML only): the hidden alias words of the page, and the glossary entries
    indexed under every name of their term."""
    glossary = getattr(app.env, "dpbook_glossary", {})
    if app.builder.format != "html" or not glossary:
        return
    groups = [names for entries in glossary.values() for _, names in entries if len(names) > 1]
    extra = aliases_for(doctree.astext(), groups)
    if extra:
        # One text node per name: the pairs of neighbouring words stay inside a name.
        doctree += search_aliases("", *(nodes.Text(name) for name in extra))
    names = dict(glossary.get(docname, ()))
    for index in doctree.findall(addnodes.index):
        entries = index["entries"]
        for entry_type, _, target, main, key in list(entries):
            for alias in names.get(target, [])[1:]:
                entries.append((entry_type, alias, target, main, key))


def setup(app) -> None:
    app.add_search_language(SearchVietnamese)
    app.add_node(search_aliases, html=(_skip, None), latex=(_skip, None), text=(_skip, None),
                 man=(_skip, None), texinfo=(_skip, None))
    app.connect("doctree-read", _read_glossary)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("doctree-resolved", _add_aliases)
