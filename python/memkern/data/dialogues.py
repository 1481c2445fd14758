"""Generated multi-party dialogues in LoCoMo's shape, harder than :func:`generate_history`.

Two or three named friends talk over dated sessions (dates written like LoCoMo's
``"1:56 pm on 8 May, 2023"``; turn ids ``"D{session}:{turn}"``, session ids ``"session_N"``).
Each speaker has facts that are introduced and change over time: a pet, the city they live in
(and a move), their job (and a job change), a sibling living elsewhere (later visited), a booked
trip, and an activity they took up. What makes it harder than the template data:

* **Paraphrased and echoed questions, as on real data.** Facts are stated with one surface form
  ("half marathon", "Guess where I'm moving?"); a question either *echoes* its evidence's words
  ("Which city is X moving to?"), with probability ``echo``, or paraphrases them
  ("Which city is X relocating to?": among the paraphrases the one with the fewest content words
  shared with the evidence, :func:`content_overlap`). On LoCoMo's development split 79% of the
  questions share a content word with their evidence (mean overlap 0.32) and 97% name a speaker;
  the default ``echo=0.7`` gives about the same (6 conversations x 20 sessions, seeds 0 / 1: 76% / 65%,
  mean 0.30 / 0.26; every question names its speaker), so
  lexical search helps here as much as on real conversations. ``echo=0`` keeps every question a
  paraphrase (the harder, lexically disjoint variant).
* **Evidence that needs a neighbouring turn.** Many facts come as a teaser, a reply, and the
  answer ("Guess where I'm moving?" / "Where?" / "Lisbon!"): the answer turn alone does not say
  what it answers, so the evidence is the teaser *and* the answer turn.
* **Distractors about the same entities.** Small talk about the same person's other facts
  ("How's Biscuit settling in?") and the same places with other people ("My cousin went to
  Lisbon last spring").
* **Chatty turns and sessions of real length.** LoCoMo's turns are long (27 words on average on
  the development split, 21 turns per session): the fact sits in a turn of chat. Every line here
  gets a reaction or a preface and follow-up sentences drawn from this module's own small-talk
  pools (``chat``, default on: ~24 words per turn), and each session ``filler_per_session``
  small-talk exchanges (default 5-8). In short turns the speaker's name and the date of the turn
  template dominate a turn's embedding, and embedding the content alone looked better than the
  template; at real lengths the template wins, as on LoCoMo.
* **Friends with the same kinds of facts.** Speakers may keep the same kind of pet, take up the
  same activity or book the same destination (pets, activities and trips are drawn per speaker
  with replacement; names, cities and jobs stay distinct), as LoCoMo's two speakers talk about the
  same subjects: then only the speaker's name tells whose fact a turn holds, which content-only
  vectors cannot see (on LoCoMo's development split dense content-only turns trail dense
  ``"{speaker}: {text}"`` turns by 21 points of R@5).
* **Question categories**: ``single-hop``, ``multi-hop`` (sibling's city + the visit),
  ``temporal`` (when something happened, relative to a session date, LoCoMo-style answers such
  as ``"the Saturday before 8 May, 2023"``), ``knowledge-update`` (the latest of changed values)
  and ``adversarial`` (asks one speaker about another speaker's fact; answer ``"not mentioned"``,
  evidence = the turn that holds the fact for the other speaker, as in LoCoMo's category 5).

All vocabulary and templates are this module's own. Everything is drawn from
``numpy.random.default_rng(seed)``: the same arguments always give the same dataset.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import bad_arg
from ..base.validate import check_int
from .schema import Conversation, Dataset, Question, Session, Turn

__all__ = ["generate_dialogues", "DIALOGUE_CATEGORIES", "content_words", "content_overlap", "format_session_date",
           "parse_session_date"]

DIALOGUE_CATEGORIES = ("single-hop", "multi-hop", "temporal", "knowledge-update", "adversarial")

# A fixed English stop list for the overlap measure (function words, question words, auxiliaries).
_STOP = frozenset("""a about after again all am an and any are as at be been before being but by can could
did do does doing done for from get got had has have having he her hers him his how i if in into is it its
just me my no not now of on or our out she so some than that the their them then there these they this to
too up us was we were what when where which who whom why will with would you your yours yes oh ok okay
really very much more most also still yet ever new one s t ll ve re d m""".split())
_WORD = re.compile(r"[a-z0-9]+")


def content_words(text: str) -> set[str]:
    """Lowercased alphanumeric tokens of ``text`` minus a fixed stop list (possessive ``'s`` dropped)."""
    return {w for w in _WORD.findall(text.lower().replace("'s ", " ").replace("’s ", " ")) if w not in _STOP}


def content_overlap(question: str, evidence: list[str]) -> float:
    """Fraction of the question's content words that occur in any evidence text (0 if it has none)."""
    q = content_words(question)
    if not q:
        return 0.0
    e: set[str] = set()
    for t in evidence:
        e |= content_words(t)
    return len(q & e) / len(q)


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def format_session_date(d: _dt.datetime) -> str:
    """LoCoMo-style session date, e.g. ``"1:56 pm on 8 May, 2023"``."""
    h = d.hour % 12 or 12
    return f"{h}:{d.minute:02d} {'am' if d.hour < 12 else 'pm'} on {d.day} {_MONTHS[d.month - 1]}, {d.year}"


def parse_session_date(text: str) -> _dt.datetime:
    """Inverse of :func:`format_session_date`."""
    return _dt.datetime.strptime(text, "%I:%M %p on %d %B, %Y")


def _day(d: _dt.date) -> str:
    return f"{d.day} {_MONTHS[d.month - 1]}, {d.year}"


# ---- vocabulary (the module's own) ----------------------------------------------------------
_NAMES = ["Caroline", "Melanie", "Priya", "Tomas", "Aisha", "Declan", "Yuki", "Rafael", "Ingrid", "Kwame",
          "Lena", "Marco", "Nadia", "Oscar", "Rosa", "Samir", "Talia", "Viktor", "Wen", "Zara"]
_SIB_NAMES = ["Jess", "Robbie", "Anya", "Felix", "Mira", "Dev", "Hana", "Luca", "Greta", "Omar", "Noor", "Pablo"]
_RELS = ["sister", "brother", "cousin"]
_CITIES = ["Lisbon", "Denver", "Glasgow", "Osaka", "Montreal", "Valencia", "Tucson", "Bergen", "Adelaide",
           "Krakow", "Halifax", "Porto", "Boise", "Ghent", "Wellington", "Savannah"]
# (species word used in the dialogue, noun used in questions, breeds/kinds, a line the owner says)
_PETS = [("puppy", "dog", ["beagle", "corgi", "husky mix", "dachshund"], "Already chewed through a sneaker."),
         ("kitten", "cat", ["tabby", "Siamese", "ginger shorthair", "tuxedo"], "Sleeps on my keyboard all day."),
         ("bunny", "rabbit", ["lop-eared", "Dutch", "lionhead"], "Hops around the living room at night."),
         ("parakeet", "bird", ["blue budgie", "green budgie", "cockatiel"], "Whistles every time the kettle boils.")]
_PET_NAMES = ["Biscuit", "Pepper", "Mochi", "Juniper", "Waffles", "Ziggy", "Clover", "Pickles", "Nova", "Tofu"]
# (evidence wording, question wording, answer)
_JOBS = [("nurse at the children's hospital", "pediatric healthcare", "a nurse"),
         ("sous chef at a tapas place", "restaurant kitchen", "a sous chef"),
         ("junior architect at a design studio", "building design", "a junior architect"),
         ("data analyst for the city council", "local government numbers", "a data analyst"),
         ("physio at a sports clinic", "injury rehabilitation", "a physio"),
         ("middle-school science teacher", "classroom education", "a science teacher"),
         ("park ranger up in the hills", "outdoor conservation", "a park ranger"),
         ("barista and latte-art trainer", "coffee", "a barista")]
_OLD_WORK = ["the bakery", "the call centre", "the bookshop", "the warehouse", "the bank branch", "the gym"]
# (evidence wording, question wording)
_ACTIVITIES = [("a half marathon", "21 km running event"), ("a pottery class", "ceramics course"),
               ("salsa lessons", "Latin dance classes"), ("the climbing wall", "bouldering gym"),
               ("a choir audition", "singing group tryout"), ("a beekeeping workshop", "apiary training"),
               ("a sourdough course", "bread-baking class"), ("an open-water swim", "lake swimming race")]
_TRIP_PLACES = [("Iceland", "the Nordic island"), ("Peru", "South America"), ("Vietnam", "Southeast Asia"),
                ("Morocco", "North Africa"), ("Norway", "Scandinavia"), ("Kenya", "East Africa"),
                ("Japan", "East Asia"), ("Mexico", "Central America")]
_FILLER = [
    ("Did you end up watching that baking show?", "Two episodes. The bread week was brutal."),
    ("It has not stopped raining since Tuesday.", "Same here, my umbrella finally gave up."),
    ("I tried that ramen spot downtown.", "Worth the queue?", "Honestly, the broth was incredible."),
    ("My phone screen cracked again.", "Again? You need a sturdier case."),
    ("Reading anything good lately?", "A thriller about a lighthouse keeper. Can't put it down."),
    ("The neighbours are renovating, drilling from 7 am.", "That sounds like torture."),
    ("I finally cleaned out the garage.", "Find anything interesting?", "Old concert tickets and a broken kite."),
    ("Traffic was insane this morning.", "Roadworks on the bridge again, I bet."),
    ("I've been learning to make dumplings.", "Save me some next time!"),
    ("Do you still play chess online?", "Every evening, my rating is climbing slowly."),
]
# Small talk that wraps each line (chat=True): an opener, a preface before a question, follow-ups.
# None of their words is a content word of a question paraphrase (tests/data/test_dialogues.py).
_OPENERS = ["Oh wow,", "Honestly,", "You know what,", "So,", "Haha,", "Well,", "Okay so,", "Oh,"]
_PREFACES = ["That is so exciting to hear!", "Hold on a second.", "I love that for you.",
             "Oh, that reminds me of something.", "Sounds like a lot going on.", "Ha, I was wondering about that."]
_FOLLOW_UPS = ["It has been such a busy week, honestly.", "I keep thinking about it, to be honest.",
               "Anyway, how are things going on your end?", "It still feels a little unreal.",
               "I will tell you more about it when we catch up properly.", "My head is still spinning a bit.",
               "Sorry, I am rambling again.", "It made me really happy.", "I was so nervous about it at the start.",
               "Let me know what you think.", "We should grab coffee soon and talk properly.",
               "Things have been hectic but good.", "I honestly did not expect any of this.",
               "It is funny how things work out sometimes."]


@dataclass
class _Line:
    speaker: str
    text: str
    key: str | None = None  # name by which questions refer to this line


@dataclass
class _Episode:
    session: int
    lines: list[_Line]


@dataclass
class _Q:
    category: str
    paraphrases: list[str]
    answer: str
    evidence_keys: list[str]
    owner: str = ""
    kind: str = ""  # fact kind for adversarial questions: pet / move / job
    echoes: list[str] = field(default_factory=list)  # forms that reuse the evidence's own words


@dataclass
class _Conv:
    episodes: list[_Episode] = field(default_factory=list)
    questions: list[_Q] = field(default_factory=list)
    n_keys: int = 0

    def key(self) -> str:
        self.n_keys += 1
        return f"k{self.n_keys}"


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _take(rng: np.random.Generator, pool: list):
    """Remove and return a random element of ``pool`` (so speakers of one conversation differ)."""
    return pool.pop(int(rng.integers(len(pool))))


def _int_range(name: str, value: Any, low: int, high: int) -> tuple[int, int]:
    """``(lo, hi)`` from a pair of ints with ``low <= lo <= hi <= high``; an error naming ``name`` otherwise."""
    expected = f"(lo, hi) with {low} <= lo <= hi <= {high}"
    try:
        lo, hi = (int(x) for x in value)
    except (TypeError, ValueError):
        raise bad_arg(name, expected, value) from None
    if not low <= lo <= hi <= high:
        raise bad_arg(name, expected, value)
    return lo, hi


def generate_dialogues(n_conversations: int = 4, sessions: int = 12, seed: int = 0, *, speakers: tuple[int, int] = (2, 3),
                       filler_per_session: tuple[int, int] = (5, 8), start_date: str = "2023-03-06",
                       name: str | None = None, echo: float = 0.7, chat: bool = True) -> Dataset:
    """Generate LoCoMo-shaped multi-party dialogues with exact evidence labels.

    Parameters
    ----------
    n_conversations : int
        Conversations (one group of friends each), >= 1.
    sessions : int
        Dated sessions per conversation, >= 6 (facts, their updates and visits need room).
    seed : int
        All randomness comes from ``numpy.random.default_rng(seed)``.
    speakers : (int, int)
        Inclusive range of speakers per conversation, within [2, 3].
    filler_per_session : (int, int)
        Inclusive range of small-talk exchanges (no facts) per session.
    start_date : str
        ISO date of the first session.
    name : str, optional
        Dataset name (default ``"dialogues-{n_conversations}x{sessions}-seed{seed}"``).
    echo : float
        Probability that a question echoes its evidence's words rather than paraphrasing them
        (module doc), in [0, 1]; default 0.7 (real data's lexical overlap).
    chat : bool
        Wrap every line in small talk (module doc; default True: turns of real length). ``False``:
        the bare lines (short turns).

    Returns
    -------
    Dataset
        Sessions ``"session_1"..``, turn ids ``"D{s}:{k}"`` (1-based), every turn with its
        ``speaker`` and the session's date; questions with ``question_type`` in
        :data:`DIALOGUE_CATEGORIES`, evidence turn and session ids set. ``Dataset.validate()`` holds.
    """
    check_int("n_conversations", n_conversations, 1)
    check_int("sessions", sessions, 6)
    check_int("seed", seed, 0)
    from ..base.validate import check_float

    echo = check_float("echo", echo, 0.0, 1.0)
    lo, hi = _int_range("speakers", speakers, 2, 3)
    flo, fhi = _int_range("filler_per_session", filler_per_session, 0, 10)
    try:
        t0 = _dt.datetime.strptime(str(start_date), "%Y-%m-%d")
    except ValueError:
        raise bad_arg("start_date", "an ISO date 'YYYY-MM-DD'", start_date) from None
    rng = np.random.default_rng(seed)
    convs = [_gen_conversation(rng, i, sessions, (lo, hi), (flo, fhi), t0, echo, bool(chat))
             for i in range(n_conversations)]
    ds = Dataset(name or f"dialogues-{n_conversations}x{sessions}-seed{seed}", convs,
                 {"generator": "memkern.data.generate_dialogues", "seed": seed, "sessions": sessions, "echo": echo,
                  "chat": bool(chat)})
    ds.validate()
    return ds


def _gen_conversation(rng, ci: int, S: int, spk_range, fill_range, t0, echo: float, chat: bool) -> Conversation:
    names = list(_NAMES)
    people = [_take(rng, names) for _ in range(int(rng.integers(spk_range[0], spk_range[1] + 1)))]
    cities, sibs, petn = list(_CITIES), list(_SIB_NAMES), list(_PET_NAMES)
    jobs, old_work = list(_JOBS), list(_OLD_WORK)
    # session dates: gaps of 3-21 days, random afternoon/evening times
    dates, d = [], t0
    for s in range(S):
        if s:
            d = d + _dt.timedelta(days=int(rng.integers(3, 22)))
        dates.append(d.replace(hour=int(rng.integers(8, 22)), minute=int(rng.integers(0, 60))))
    cv = _Conv()
    facts: dict[str, set[str]] = {p: set() for p in people}  # which fact kinds each person has
    home: dict[str, str] = {}

    def other(p):
        return _pick(rng, [x for x in people if x != p])

    def when(lo: int = 0, hi: int | None = None) -> int:
        """A random session index in [lo, hi) (hi defaults to the number of sessions)."""
        return int(rng.integers(lo, S if hi is None else hi))

    for p in people:
        # -- home city (stated early), optionally a move later (knowledge-update + neighbour evidence)
        c0 = _take(rng, cities)
        home[p] = c0
        s0 = when(0, max(1, S // 4))
        k0 = cv.key()
        cv.episodes.append(_Episode(s0, [
            _Line(other(p), f"{p}, how long have you been in {c0} now?"),
            _Line(p, f"Nine years! {c0} feels like home at this point.", k0)]))
        if rng.random() < 0.7:
            c1 = _take(rng, cities)
            s1 = when(s0 + 1)
            ka, kb = cv.key(), cv.key()
            cv.episodes.append(_Episode(s1, [
                _Line(p, "Okay, guess where I'm moving at the end of the month?", ka),
                _Line(other(p), "No idea, where?"),
                _Line(p, f"{c1}! Signed the lease yesterday.", kb)]))
            facts[p].add("move")
            cv.questions.append(_Q("single-hop", [f"Which city is {p} relocating to?",
                                                  f"To what town does {p} plan to relocate?"], c1, [ka, kb], p, "move",
                                   [f"Which city is {p} moving to?"]))
            cv.questions.append(_Q("knowledge-update", [f"Where does {p} reside currently?",
                                                        f"In which town is {p} based at present?"], c1, [k0, ka, kb],
                                   echoes=[f"Which city is home for {p} after the move?"]))
        else:
            cv.questions.append(_Q("single-hop", [f"Where does {p} reside?", f"Which town is {p} based in?"],
                                   c0, [k0], echoes=[f"Which city is home for {p}?"]))
        # -- pet: teaser / question / answer
        if rng.random() < 0.75:
            word, noun, kinds, quip = _pick(rng, _PETS)  # friends may keep the same kind of pet
            kind, pn = _pick(rng, kinds), _take(rng, petn)
            s = when()
            wd = int(rng.integers(7))
            ka, kb = cv.key(), cv.key()
            cv.episodes.append(_Episode(s, [
                _Line(p, f"We have a new family member since {_WEEKDAYS[wd]}!", ka),
                _Line(other(p), "Wait, what? Who?"),
                _Line(p, f"A little {kind} {word}. We're calling him {pn}. {quip}", kb)]))
            facts[p].add("pet")
            cv.questions.append(_Q("single-hop", [f"What did {p} name the {noun}?", f"What is {p}'s {noun} called?"],
                                   pn, [ka, kb], p, "pet:" + noun, [f"What name did {p} give the {word}?"]))
            sd = dates[s].date()
            back = (sd.weekday() - wd) % 7 or 7
            cv.questions.append(_Q("temporal", [f"When did {p} adopt the {noun}?",
                                                f"On what day did the {noun} join {p}'s household?"],
                                   f"the {_WEEKDAYS[wd]} before {_day(sd)} ({_day(sd - _dt.timedelta(days=back))})",
                                   [ka], echoes=[f"When did the new family member arrive at {p}'s?"]))
            # distractor: same pet, other facts
            cv.episodes.append(_Episode(when(s + 1) if s + 1 < S else s, [
                _Line(other(p), f"How is {pn} settling in?"),
                _Line(p, f"{pn} had the vet check-up this week, all fine. Still very shy with guests.")]))
        # -- job change: teaser / question / answer
        if rng.random() < 0.75:
            ev, qv, ans = _take(rng, jobs)
            ow = _take(rng, old_work)
            s = when(1)
            ka, kb = cv.key(), cv.key()
            cv.episodes.append(_Episode(s, [
                _Line(p, f"Today was my last shift at {ow}.", ka),
                _Line(other(p), "Wait, you quit? What's next?"),
                _Line(p, f"I start as a {ev} on Monday!", kb)]))
            facts[p].add("job")
            cv.questions.append(_Q("single-hop", [f"What profession did {p} take up?",
                                                  f"What does {p} do for a living these days?"], ans, [ka, kb], p, "job",
                                   [f"What job does {p} start on Monday?"]))
            # distractor: same person, other facts about work
            cv.episodes.append(_Episode(when(), [
                _Line(p, "Work has been exhausting this week, I need a holiday."),
                _Line(other(p), "You always say that in spring.")]))
        # -- sibling in another city (multi-hop with a later visit)
        if rng.random() < 0.6 and S >= 3:
            rel = _pick(rng, _RELS)
            sib, sc = _take(rng, sibs), _take(rng, cities)
            s1 = when(0, S - 1)
            s2 = when(s1 + 1)
            k1, k2 = cv.key(), cv.key()
            cv.episodes.append(_Episode(s1, [
                _Line(p, f"My {rel} {sib} finally bought a flat in {sc}.", k1),
                _Line(other(p), "Oh nice, is it near the water?")]))
            cv.episodes.append(_Episode(s2, [
                _Line(p, f"Just got back from four days at {sib}'s place.", k2),
                _Line(other(p), "How was it?"),
                _Line(p, "Lovely. We mostly ate and walked around the old harbour.")]))
            facts[p].add("visit")
            cv.questions.append(_Q("multi-hop", [f"Which city did {p} travel to for a family visit?",
                                                 f"In what town did {p} stay with a relative recently?"], sc, [k1, k2],
                                   echoes=[f"Which city did {p} spend four days in?"]))
        # -- booked trip (temporal)
        if rng.random() < 0.6:
            place, region = _pick(rng, _TRIP_PLACES)
            s = when()
            lead = int(rng.integers(10, 60))
            go = dates[s].date() + _dt.timedelta(days=lead)
            ka, kb = cv.key(), cv.key()
            cv.episodes.append(_Episode(s, [
                _Line(p, "We finally booked it!", ka),
                _Line(other(p), "Booked what?"),
                _Line(p, f"Two weeks in {place}, flying out on {go.day} {_MONTHS[go.month - 1]}.", kb)]))
            facts[p].add("trip")
            cv.questions.append(_Q("temporal", [f"When does {p}'s vacation in {region} begin?",
                                                f"On which date will {p} depart for {region}?"], _day(go), [kb],
                                   echoes=[f"When is {p} flying out for the trip?"]))
        # -- activity taken up (single-hop with paraphrase; distractor by another speaker)
        ev, qv = _pick(rng, _ACTIVITIES)
        s = when()
        k = cv.key()
        cv.episodes.append(_Episode(s, [
            _Line(other(p), "You seem in a good mood."),
            _Line(p, f"I signed up for {ev} this weekend, first time ever!", k)]))
        cv.questions.append(_Q("temporal", [f"When did {p} first try the {qv}?",
                                            f"Around what date was {p}'s first go at the {qv}?"],
                               f"the weekend after {_day(dates[s].date())}", [k],
                               echoes=[f"When did {p} try {ev}?"]))
    # distractors: same places, other people
    for p, c in home.items():
        q = other(p)
        cv.episodes.append(_Episode(when(), [
            _Line(q, f"My cousin went to {c} last spring and complained about the hills."),
            _Line(p, "Ha, the hills are half the charm.")]))
    # adversarial: ask a person about a fact kind only another person has
    for kind, tmpl in (("pet", "What is {x}'s {noun} called?"), ("move", "Which city is {x} relocating to?"),
                       ("job", "What profession did {x} take up?")):
        lack = [p for p in people if kind not in facts[p]]
        src = [q for q in cv.questions if q.kind.split(":")[0] == kind]
        if not lack or not src:
            continue
        q0, x = _pick(rng, src), _pick(rng, lack)
        cv.questions.append(_Q("adversarial", [tmpl.format(x=x, noun=q0.kind.partition(":")[2])], "not mentioned",
                               list(q0.evidence_keys)))
    # filler exchanges (no facts)
    for s in range(S):
        n = int(rng.integers(fill_range[0], fill_range[1] + 1))
        for fi in rng.choice(len(_FILLER), size=n, replace=False):
            ex = _FILLER[int(fi)]
            a = _pick(rng, people)
            b = other(a)
            cv.episodes.append(_Episode(s, [_Line(a if i % 2 == 0 else b, t) for i, t in enumerate(ex)]))
    return _assemble(rng, ci, people, dates, cv, echo, chat)


def _chatty(rng, text: str) -> str:
    """``text`` in small talk: maybe an opener; before a question a preface, after a statement one
    or two follow-up sentences (so a question line still ends with its question mark)."""
    out = text
    if rng.random() < 0.5:
        out = f"{_pick(rng, _OPENERS)} {out[0].lower() + out[1:] if out[:2] != out[:2].upper() else out}"
    if out.endswith("?"):
        if rng.random() < 0.7:
            out = f"{_pick(rng, _PREFACES)} {out}"
    else:
        n = int(rng.choice([1, 2, 3, 3, 4]))
        if n:
            picks = rng.choice(len(_FOLLOW_UPS), size=n, replace=False)
            out = " ".join([out] + [_FOLLOW_UPS[int(i)] for i in picks])
    return out


def _assemble(rng, ci: int, people: list[str], dates, cv: _Conv, echo: float, chat: bool = False) -> Conversation:
    cid = f"dlg-{ci}"
    by_s: dict[int, list[_Episode]] = {}
    for e in cv.episodes:
        by_s.setdefault(e.session, []).append(e)
    sessions: list[Session] = []
    where: dict[str, tuple[str, str]] = {}  # key -> (turn_id, session_id)
    text: dict[str, str] = {}
    for s, d in enumerate(dates):
        sid, sdate = f"session_{s + 1}", format_session_date(d)
        sess = Session(sid, sdate)
        eps = by_s.get(s, [])
        order = rng.permutation(len(eps))
        for j in order:
            for ln in eps[int(j)].lines:
                k = len(sess.turns)
                tid = f"D{s + 1}:{k + 1}"
                role = "user" if ln.speaker == people[0] else "assistant"
                sess.turns.append(Turn(tid, role, _chatty(rng, ln.text) if chat else ln.text, sid, k, sdate,
                                       ln.speaker, False))
                if ln.key:
                    where[ln.key] = (tid, sid)
                    text[ln.key] = sess.turns[-1].content
        sessions.append(sess)
    ev_ids = {where[k][0] for q in cv.questions for k in q.evidence_keys if q.category != "adversarial"}
    for sess in sessions:
        for t in sess.turns:
            t.has_answer = t.turn_id in ev_ids
    questions: list[Question] = []
    for j, q in enumerate(cv.questions):
        ev_text = [text[k] for k in q.evidence_keys]
        scores = [content_overlap(p, ev_text) for p in q.paraphrases]
        best = min(scores)
        cands = [p for p, sc in zip(q.paraphrases, scores) if sc == best]
        pick, u = int(rng.integers(len(cands))), float(rng.random())  # both drawn for every question
        qtext = q.echoes[0] if q.echoes and u < echo else cands[pick]
        tids = [where[k][0] for k in q.evidence_keys]
        sids: list[str] = []
        for k in q.evidence_keys:
            if where[k][1] not in sids:
                sids.append(where[k][1])
        questions.append(Question(f"{cid}/q{j}", qtext, q.answer, q.category, tids, sids,
                                  format_session_date(dates[-1] + _dt.timedelta(days=1)), cid))
    return Conversation(cid, sessions, questions)

