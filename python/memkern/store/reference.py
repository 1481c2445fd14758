"""Lexical retrieval reference: tokeniser, stop list, BM25 and rank fusion (float64, pure Python).

The C++ store (``csrc/include/memkern/lexical.h``) carries a twin of :func:`tokenize` that must give
exactly the same tokens; ``tests/store/test_lexical.py`` checks both on fuzzed Unicode strings. This module
is the specification. Nothing here depends on the Unicode database of the running Python: every
mapping is an explicit table below, so the result cannot change with the Python version.

Tokeniser specification
-----------------------
1. The input is a sequence of Unicode code points (the C++ twin decodes UTF-8 and rejects invalid
   UTF-8; Python ``str`` may carry lone surrogates, which are separators here).
2. Every code point is first lowercased by :func:`lower_code_point`, which maps exactly these
   ranges and leaves every other code point unchanged:

   - ASCII ``A-Z`` (U+0041-U+005A) -> +0x20;
   - Latin-1 Supplement U+00C0-U+00DE except U+00D7 (multiplication sign) -> +0x20;
   - Latin Extended-A (U+0100-U+017F): the upper case member of each pair -> +1 (even code points
     in U+0100-U+012F, U+0132-U+0137, U+014A-U+0177; odd ones in U+0139-U+0148, U+0179-U+017E);
     U+0130 (capital I with dot) -> ``i`` (U+0069); U+0178 (Y with diaeresis) -> U+00FF;
   - Greek: U+0386 -> U+03AC, U+0388-U+038A -> +0x25, U+038C -> U+03CC, U+038E-U+038F -> +0x3F,
     U+0391-U+03A1 and U+03A3-U+03AB -> +0x20, and final sigma U+03C2 -> U+03C3 (so that a word
     matches whether or not it ends the string: a fold, not ``str.lower``);
   - Cyrillic: U+0400-U+040F -> +0x50, U+0410-U+042F -> +0x20, the upper case member of each pair
     -> +1 (even code points in U+0460-U+0481, U+048A-U+04BF, U+04D0-U+04FF; odd ones in
     U+04C1-U+04CE), U+04C0 -> U+04CF;
   - fullwidth Latin capitals U+FF21-U+FF3A -> +0x20.

   Apart from U+0130 and U+03C2 this agrees with ``str.lower`` on those ranges (tested).
3. Each lowercased code point has a class from :data:`CHAR_CLASSES` (sorted, inclusive ranges):
   ``WORD`` (letters, digits and combining marks of the covered scripts), ``IDEO`` (CJK ideographs
   and kana) or, for every code point outside the table, separator.
4. A token is a maximal run of ``WORD`` code points, or a single ``IDEO`` code point (CJK text has
   no spaces, so each ideograph / kana is its own token). Separators end a run and are dropped.
   The apostrophe is a separator: ``"Caroline's"`` gives ``caroline``, ``s``.
5. Tokens in :data:`STOP_WORDS` are dropped (unless ``keep_stop_words=True``).

BM25 (:func:`bm25_scores`): for a query with distinct terms ``t`` and a document ``d`` of length
``|d|`` tokens (after stop words) among ``N`` documents of mean length ``avgdl``,

    score(d) = sum_t idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl)),
    idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)),

with ``k1 = 1.2``, ``b = 0.75``; a query term repeated counts once; a document that contains no
query term scores 0 and is not a lexical hit.

Coverage (:func:`coverage_scores`): the idf-weighted fraction of the query's distinct terms that a
document holds,

    coverage(d) = sum_{t in q, t in d} idf(t) / sum_{t in q} idf(t),

with the BM25 ``idf`` (a term no document holds has ``df = 0`` and counts in the denominator only).
It lies in [0, 1] and has no term frequency and no length normalisation: in a conversation where
every turn carries its speaker's name, BM25's length normalisation ranks the speaker's shortest
turns ("Booked what?") first for any question naming them; coverage ranks every turn holding the
name equally and adds the other matched words on top.

Fusion: :func:`rrf` (reciprocal rank, ``k0 = 60``, ranks from 1), :func:`weighted_fusion`
(min-max normalised scores per list; a list whose scores are all equal normalises to 1) and
:func:`coverage_fusion` (the dense list min-max normalised plus the coverage list divided by its
best score). They
weigh the lists (``weights`` / ``weight``), treat id ``-1`` as padding, and order by fused score
descending, then id ascending.

Why the store's hybrid default is ``fusion="coverage"``, ``lexical_weight=0.35``: chosen on tuning
dialogues (:func:`memkern.data.generate_dialogues`, seeds 100-104, disjoint from the evaluation
seeds 0-4) in ``bench/bench_lexical.py`` (tuning part); numbers in ``bench/RESULTS.md`` (lexical
section). With vectors of the turn text (name included) BM25 with RRF or min-max fusion lost to
dense retrieval at every weight; the best setting overall embeds the turn content in the vectors
and leaves the names to the lexical side (texts ``"{speaker}: {content}"``).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from ..errors import MemkernTypeError, bad_arg

__all__ = [
    "STOP_WORDS", "CHAR_CLASSES", "WORD", "IDEO", "K1", "B", "RRF_K0",
    "lower_code_point", "char_class", "tokenize", "bm25_scores", "coverage_scores", "rrf", "weighted_fusion",
    "coverage_fusion", "FUSIONS", "DEFAULT_FUSION", "DEFAULT_LEXICAL_WEIGHT",
]

#: BM25 constants used by the store.
K1 = 1.2
B = 0.75
#: The hybrid search's fusions (store ``search(fusion=...)``), their native codes, and the defaults
#: measured best (module docstring).
FUSIONS = {"rrf": 0, "weighted": 1, "coverage": 2}
DEFAULT_FUSION = "coverage"
DEFAULT_LEXICAL_WEIGHT = 0.35
#: Reciprocal-rank-fusion constant: a document at rank r (from 1) gets ``weight / (RRF_K0 + r)``.
RRF_K0 = 60

#: Code point classes of :data:`CHAR_CLASSES`.
WORD = 1
IDEO = 2

#: Sorted, disjoint, inclusive ranges ``(first, last, class)``; every code point outside is a
#: separator. The C++ twin holds the same table (``kCharClasses`` in ``lexical.h``).
CHAR_CLASSES: tuple[tuple[int, int, int], ...] = (
    (0x0030, 0x0039, WORD),   # ASCII digits
    (0x0041, 0x005A, WORD),   # ASCII capitals (lowercased before classing; kept for completeness)
    (0x0061, 0x007A, WORD),   # ASCII small letters
    (0x00C0, 0x00D6, WORD),   # Latin-1 letters
    (0x00D8, 0x00F6, WORD),
    (0x00F8, 0x0373, WORD),   # Latin-1, Latin Extended-A/B, IPA, modifiers, combining marks, Greek
    (0x0376, 0x037D, WORD),   # Greek (U+0374/0375 numeral signs, U+037E question mark excluded)
    (0x037F, 0x037F, WORD),
    (0x0386, 0x0386, WORD),   # U+0384/0385 tonos and U+0387 ano teleia are separators
    (0x0388, 0x0481, WORD),   # Greek, Coptic, Cyrillic (U+0482 thousands sign excluded)
    (0x0483, 0x0588, WORD),   # Cyrillic marks and supplement, Armenian
    (0x058A, 0x05BD, WORD),   # Hebrew (U+0589 Armenian full stop, U+05BE maqaf excluded)
    (0x05BF, 0x05BF, WORD),
    (0x05C1, 0x05C2, WORD),   # U+05C0 paseq, U+05C3 sof pasuq excluded
    (0x05C4, 0x05C5, WORD),
    (0x05C7, 0x05F2, WORD),   # U+05C6 nun hafukha excluded
    (0x05F5, 0x060B, WORD),   # U+05F3/05F4 geresh excluded; Arabic
    (0x060D, 0x061A, WORD),   # U+060C Arabic comma excluded
    (0x061C, 0x061E, WORD),   # U+061B semicolon, U+061F question mark excluded
    (0x0620, 0x0669, WORD),
    (0x066E, 0x06D3, WORD),   # U+066A-066D Arabic punctuation excluded
    (0x06D5, 0x0963, WORD),   # U+06D4 full stop excluded; Syriac ... Devanagari
    (0x0966, 0x0E4E, WORD),   # U+0964/0965 dandas excluded; Indic scripts, Thai
    (0x0E50, 0x0E59, WORD),   # U+0E4F fongman excluded
    (0x0E5C, 0x10FA, WORD),   # U+0E5A/0E5B excluded; Lao ... Georgian
    (0x10FC, 0x135F, WORD),   # U+10FB excluded; Hangul Jamo, Ethiopic
    (0x1369, 0x166C, WORD),   # U+1360-1368 Ethiopic punctuation excluded; Cherokee, Canadian
    (0x166F, 0x167F, WORD),   # U+166D/166E excluded
    (0x1681, 0x16EA, WORD),   # U+1680 Ogham space excluded; Ogham, Runic
    (0x16EE, 0x17D3, WORD),   # U+16EB-16ED Runic punctuation excluded; Khmer
    (0x17DB, 0x17FF, WORD),   # U+17D4-17DA Khmer punctuation excluded
    (0x180B, 0x180D, WORD),   # U+1800-180A Mongolian punctuation excluded
    (0x180F, 0x1FFF, WORD),   # U+180E excluded; Mongolian ... Latin Extended Additional, Greek Extended
    (0x2C00, 0x2DFF, WORD),   # Glagolitic, Latin Extended-C, Coptic, Georgian, Tifinagh, Cyrillic Ext-A
    (0x2E80, 0x2FDF, IDEO),   # CJK radicals
    (0x3041, 0x30FA, IDEO),   # Hiragana, Katakana (U+30FB middle dot excluded)
    (0x30FC, 0x30FF, IDEO),
    (0x3100, 0x318F, WORD),   # Bopomofo, Hangul compatibility jamo
    (0x3400, 0x4DBF, IDEO),   # CJK Extension A
    (0x4E00, 0x9FFF, IDEO),   # CJK Unified Ideographs
    (0xA000, 0xABFF, WORD),   # Yi, Vai, Cyrillic Ext-B, ..., Hangul Jamo Ext-A, Meetei Mayek
    (0xAC00, 0xD7FF, WORD),   # Hangul syllables, Jamo Ext-B
    (0xF900, 0xFAFF, IDEO),   # CJK compatibility ideographs
    (0xFB00, 0xFDFF, WORD),   # alphabetic and Arabic presentation forms A
    (0xFE70, 0xFEFE, WORD),   # Arabic presentation forms B
    (0xFF10, 0xFF19, WORD),   # fullwidth digits
    (0xFF21, 0xFF3A, WORD),   # fullwidth capitals
    (0xFF41, 0xFF5A, WORD),   # fullwidth small letters
    (0xFF66, 0xFF9F, IDEO),   # halfwidth katakana
    (0xFFA0, 0xFFDC, WORD),   # halfwidth Hangul
    (0x10000, 0x1CFFF, WORD),  # supplementary historic and minority scripts
    (0x20000, 0x3FFFF, IDEO),  # CJK Extensions B and beyond
)

_STARTS = [r[0] for r in CHAR_CLASSES]

#: The fixed English stop list (lowercase; applied after lowercasing). Function words only:
#: articles, pronouns, auxiliaries, prepositions, conjunctions, and the clitic fragments an
#: apostrophe split leaves (``s``, ``t``, ``d``, ``ll``, ``m``, ``re``, ``ve``). No content word,
#: name, number or date is on it. Changing it changes every stored BM25 score, so it is frozen.
STOP_WORDS: frozenset[str] = frozenset("""
a about above after again against all am an and any are as at
be because been before being below between both but by
can could
d did do does doing down during
each
few for from further
had has have having he her here hers herself him himself his how
i if in into is it its itself
just
ll
m me more most my myself
no nor not now
of off on once only or other our ours ourselves out over own
re
s same she should so some such
t than that the their theirs them themselves then there these they this those through to too
under until up
ve very
was we were what when where which while who whom why will with would
you your yours yourself yourselves
""".split())


def lower_code_point(c: int) -> int:
    """The lowercase of code point ``c`` under the tokeniser's fixed table (module docstring, step 2)."""
    if c < 0x80:
        return c + 0x20 if 0x41 <= c <= 0x5A else c
    if c <= 0xDE:
        return c + 0x20 if c >= 0xC0 and c != 0xD7 else c
    if 0x0100 <= c <= 0x017F:
        if c == 0x0130:
            return 0x69
        if c == 0x0178:
            return 0xFF
        if (0x0100 <= c <= 0x012F or 0x0132 <= c <= 0x0137 or 0x014A <= c <= 0x0177) and c % 2 == 0:
            return c + 1
        if (0x0139 <= c <= 0x0148 or 0x0179 <= c <= 0x017E) and c % 2 == 1:
            return c + 1
        return c
    if 0x0386 <= c <= 0x03C2:
        if c == 0x0386:
            return 0x03AC
        if 0x0388 <= c <= 0x038A:
            return c + 0x25
        if c == 0x038C:
            return 0x03CC
        if 0x038E <= c <= 0x038F:
            return c + 0x3F
        if 0x0391 <= c <= 0x03AB and c != 0x03A2:
            return c + 0x20
        if c == 0x03C2:
            return 0x03C3
        return c
    if 0x0400 <= c <= 0x04FF:
        if c <= 0x040F:
            return c + 0x50
        if c <= 0x042F:
            return c + 0x20
        if c == 0x04C0:
            return 0x04CF
        if (0x0460 <= c <= 0x0481 or 0x048A <= c <= 0x04BF or 0x04D0 <= c <= 0x04FF) and c % 2 == 0:
            return c + 1
        if 0x04C1 <= c <= 0x04CE and c % 2 == 1:
            return c + 1
        return c
    if 0xFF21 <= c <= 0xFF3A:
        return c + 0x20
    return c


def char_class(c: int) -> int:
    """``WORD``, ``IDEO`` or 0 (separator) for code point ``c`` (after lowercasing)."""
    import bisect

    i = bisect.bisect_right(_STARTS, c) - 1
    if i >= 0 and c <= CHAR_CLASSES[i][1]:
        return CHAR_CLASSES[i][2]
    return 0


def tokenize(text: str, *, keep_stop_words: bool = False) -> list[str]:
    """Tokens of ``text`` (module docstring): lowercased word runs, one token per CJK ideograph.

    Parameters
    ----------
    text : str
    keep_stop_words : bool
        Keep tokens of :data:`STOP_WORDS` (default: drop them, as the store's index does).

    Returns
    -------
    list of str, in text order, with repetitions.
    """
    if not isinstance(text, str):
        raise bad_arg("text", "a str", type(text).__name__, MemkernTypeError)
    out: list[str] = []
    run: list[str] = []
    for ch in text:
        c = lower_code_point(ord(ch))
        cls = char_class(c)
        if cls == WORD:
            run.append(chr(c))
            continue
        if run:
            out.append("".join(run))
            run = []
        if cls == IDEO:
            out.append(chr(c))
    if run:
        out.append("".join(run))
    if keep_stop_words:
        return out
    return [t for t in out if t not in STOP_WORDS]


def bm25_scores(query: str | Sequence[str], docs: Sequence[str | Sequence[str]], *,
                k1: float = K1, b: float = B) -> np.ndarray:
    """BM25 score of every document for one query, in float64 (formula in the module docstring).

    Parameters
    ----------
    query : str or sequence of str
        Query text (tokenised with :func:`tokenize`) or its tokens.
    docs : sequence of (str or sequence of str)
        The ``N`` documents of the collection (texts or token lists); they define ``N``, ``df`` and
        ``avgdl``.
    k1, b : float
        BM25 constants (the store uses 1.2 and 0.75).

    Returns
    -------
    numpy.ndarray, float64, shape ``[N]``; 0 for documents without any query term.
    """
    q = tokenize(query) if isinstance(query, str) else list(query)
    toks = [tokenize(d) if isinstance(d, str) else list(d) for d in docs]
    n = len(toks)
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    lengths = np.array([len(t) for t in toks], dtype=np.float64)
    avgdl = float(lengths.sum()) / n
    if avgdl == 0.0:
        return out
    counts = [Counter(t) for t in toks]
    for term in dict.fromkeys(q):
        df = sum(1 for c in counts if term in c)
        if df == 0:
            continue
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        for i, c in enumerate(counts):
            tf = c.get(term, 0)
            if tf:
                out[i] += idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * lengths[i] / avgdl))
    return out


def _order(fused: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    items = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
    return (np.array([i for i, _ in items], dtype=np.int64),
            np.array([s for _, s in items], dtype=np.float64))


def _weights(weights: Iterable[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    w = [float(x) for x in weights]
    if len(w) != n:
        raise bad_arg("weights", f"{n} weights (one per list)", len(w))
    return w


def rrf(lists: Sequence[Sequence[int]], weights: Sequence[float] | None = None, *,
        k0: int = RRF_K0) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion of ranked id lists: ``score(d) = sum_i w_i / (k0 + rank_i(d))``.

    Parameters
    ----------
    lists : sequence of sequences of int
        Ranked ids, best first; ``-1`` entries are padding and skipped (they do not take a rank).
    weights : sequence of float, optional
        One weight per list (default 1 each).
    k0 : int
        Rank offset (60).

    Returns
    -------
    (ids int64 [M], scores float64 [M]) over the union of the lists, best first (ties: id ascending).
    """
    w = _weights(weights, len(lists))
    fused: dict[int, float] = {}
    for wi, ids in zip(w, lists):
        rank = 0
        for rid in ids:
            rid = int(rid)
            if rid < 0:
                continue
            rank += 1
            fused[rid] = fused.get(rid, 0.0) + wi / (k0 + rank)
    return _order(fused)


def weighted_fusion(lists: Sequence[tuple[Sequence[int], Sequence[float]]],
                    weights: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Weighted sum of min-max normalised scores: ``score(d) = sum_i w_i * (s_i(d) - min_i) / (max_i - min_i)``.

    Parameters
    ----------
    lists : sequence of (ids, scores)
        Each list's ids and scores (higher is better); ``-1`` ids are padding and skipped. A list
        whose kept scores are all equal normalises them to 1; a document absent from a list gets 0
        from it.
    weights : sequence of float, optional
        One weight per list (default 1 each).

    Returns
    -------
    (ids int64 [M], scores float64 [M]) over the union of the lists, best first (ties: id ascending).
    """
    w = _weights(weights, len(lists))
    fused: dict[int, float] = {}
    for wi, (ids, scores) in zip(w, lists):
        kept = [(int(i), float(s)) for i, s in zip(ids, scores) if int(i) >= 0]
        if not kept:
            continue
        lo = min(s for _, s in kept)
        hi = max(s for _, s in kept)
        for rid, s in kept:
            norm = 1.0 if hi == lo else (s - lo) / (hi - lo)
            fused[rid] = fused.get(rid, 0.0) + wi * norm
    return _order(fused)



def coverage_scores(query: str | Sequence[str], docs: Sequence[str | Sequence[str]]) -> np.ndarray:
    """Idf-weighted query-term coverage of every document, in float64 (module docstring).

    Parameters
    ----------
    query : str or sequence of str
        Query text (tokenised with :func:`tokenize`) or its tokens; repeated terms count once.
    docs : sequence of (str or sequence of str)
        The ``N`` documents of the collection (texts or token lists); they define ``N`` and ``df``.

    Returns
    -------
    numpy.ndarray, float64, shape ``[N]``, in [0, 1]; 0 for documents without any query term.
    """
    q = tokenize(query) if isinstance(query, str) else list(query)
    sets = [set(tokenize(d) if isinstance(d, str) else d) for d in docs]
    n = len(sets)
    acc = np.zeros(n, dtype=np.float64)
    if n == 0:
        return acc
    total = 0.0
    for term in dict.fromkeys(q):
        holders = [i for i, s in enumerate(sets) if term in s]
        df = len(holders)
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        total += idf
        for i in holders:
            acc[i] += idf
    if not total > 0.0:
        return np.zeros(n, dtype=np.float64)
    return acc / total


def coverage_fusion(dense: tuple[Sequence[int], Sequence[float]], lexical: tuple[Sequence[int], Sequence[float]],
                    weight: float) -> tuple[np.ndarray, np.ndarray]:
    """``score(d) = (1 - weight) * minmax(dense)(d) + weight * coverage(d) / max(coverage)``.

    Parameters
    ----------
    dense : (ids, scores)
        The dense list (higher is better), min-max normalised over its own kept entries like
        :func:`weighted_fusion` (all equal -> 1); ``-1`` ids are padding.
    lexical : (ids, scores)
        The lexical list scored by :func:`coverage_scores` (hits only: scores > 0), divided by its
        best score (not min-max normalised: a record that holds only the query's name keeps its
        share when it is the list's worst).
    weight : float
        Weight of the lexical list.

    Returns
    -------
    (ids int64 [M], scores float64 [M]) over the union of the lists, best first (ties: id ascending).
    """
    w = float(weight)
    fused: dict[int, float] = {}
    kept = [(int(i), float(s)) for i, s in zip(*dense) if int(i) >= 0]
    if kept:
        lo = min(s for _, s in kept)
        hi = max(s for _, s in kept)
        for rid, s in kept:
            fused[rid] = fused.get(rid, 0.0) + (1.0 - w) * (1.0 if hi == lo else (s - lo) / (hi - lo))
    lex = [(int(i), float(s)) for i, s in zip(*lexical) if int(i) >= 0]
    best = max((s for _, s in lex), default=0.0)
    for rid, s in lex:
        fused[rid] = fused.get(rid, 0.0) + w * (s / best)
    return _order(fused)
