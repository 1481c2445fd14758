"""Conflicting facts without a model: who says what about which slot, and when a later statement
supersedes an earlier one.

:func:`statements` reads first-person statements of a turn into :class:`Statement` s, one per
(subject, attribute, value): the subject is the speaker ("I" / "we" / "my"), the attribute one of
:data:`ATTRIBUTES`, the value a normalised phrase ("berlin", "nurse at st mary's hospital") and
``negated`` marks a withdrawal ("I no longer work at ...", "we broke up", "Max passed away").
:func:`contradicts` says whether a later statement makes an earlier one stale:

- a single-valued attribute (``location``, ``job``, ``relationship``, ``car``, ``diet``,
  ``favorite:<x>``, ``trip:<name>``) with a different value ("I moved to Munich" after "I live in Berlin"), or
  withdrawn ("I quit my job" after "I work at the bakery"; a withdrawal naming a value must name
  the old one);
- a multi-valued one (``pet`` by name, ``activity`` by its words) only by a withdrawal of the
  same value ("Biscuit passed away" after "we adopted a beagle named Biscuit").

Precision comes first (a false contradiction hides true evidence): only fixed first-person
patterns are read; questions, hypotheticals ("if", "would", "wish", "want to", "planning"), other
people ("my sister lives in ...") and reported speech are not statements. Values are equal when
one's words contain the other's ("berlin" and "berlin germany"). English only.

:func:`find_contradictions` pairs later statements with the earlier ones they supersede; RMM uses
it at ``end_session`` (``RMMConfig.supersede``) and :class:`memkern.ingest.apply.EmbeddingDecider` uses
it to UPDATE / INVALIDATE instead of MERGE.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import MemkernTypeError, bad_arg

__all__ = ["Statement", "ATTRIBUTES", "SINGLE_VALUED", "statements", "contradicts", "find_contradictions",
           "same_value"]

#: Attributes read by :func:`statements` (``favorite:<thing>`` / ``trip:<name>``: one attribute per
#: thing / named trip).
ATTRIBUTES = ("location", "job", "relationship", "pet", "car", "diet", "favorite", "trip", "activity")
#: Attributes with one current value (a different later value supersedes the earlier one).
SINGLE_VALUED = frozenset({"location", "job", "relationship", "car", "diet", "favorite", "trip"})


@dataclass(frozen=True)
class Statement:
    """One first-person statement about a slot.

    Attributes
    ----------
    subject : str
        The speaker, lowercased ("caroline", "user").
    attribute : str
        One of :data:`ATTRIBUTES` (``"favorite:<thing>"`` for favourites).
    value : str or None
        The normalised value; ``None`` for a withdrawal that names none ("I quit my job").
    negated : bool
        A withdrawal ("no longer", "quit", "broke up", "passed away").
    text : str
        The sentence it was read from.
    """

    subject: str
    attribute: str
    value: str | None
    negated: bool
    text: str


# ----------------------------------------------------------------------------------- patterns

_I = r"(?:\bi|\bwe)"
_BE = r"(?:'m|’m| am|'re|’re| are)"
_ADV = r"(?:(?:still|now|currently|finally|just|recently|officially|actually|also)\s+)*"
# a place: capitalised words (matched case-sensitively), e.g. "Berlin", "New York", "St. Louis"
_PLACE = r"(?P<v>(?-i:[A-Z][\w'’.-]*(?:[ -](?:[A-Z][\w'’.-]*|(?:of|de|la|del|upon|on)(?= [A-Z])))*))"
# a noun phrase: up to 7 words, cut later at clause words
_NP = r"(?P<v>[\w&'’.-]+(?: [\w&'’.-]+){0,6})"
_NAME = r"(?P<v>(?-i:[A-Z][a-z'’-]+(?: [A-Z][a-z'’-]+)?))"
_PET = (r"(?:dog|cat|puppy|pup|kitten|kitty|bunny|rabbit|parrot|bird|budgie|parakeet|cockatiel|hamster|guinea pig|"
        r"fish|turtle|tortoise|horse|pony|snake|lizard|ferret|chinchilla|gecko|beagle|corgi|husky|retriever|labrador|"
        r"lab|poodle|terrier|shepherd|greyhound|dachshund|tabby|siamese|spaniel|collie|pug|bulldog|chihuahua|"
        r"doodle|mutt|pup)")
_VEHICLE = re.compile(r"\b(?:car|truck|suv|van|sedan|hatchback|pickup|motorcycle|scooter|minivan|jeep|"
                      r"honda|toyota|ford|tesla|subaru|mazda|volkswagen|vw|hyundai|kia|bmw|audi|mercedes|nissan|"
                      r"chevy|chevrolet|volvo|prius|civic|corolla|porsche|lexus|fiat|mini cooper|ranger|outback)\b",
                      re.I)


def _rx(p: str) -> re.Pattern:
    return re.compile(p, re.I)


# (attribute, negated, pattern). Patterns are tried on one sentence at a time.
_PATTERNS: list[tuple[str, bool, re.Pattern]] = [
    # location
    ("location", True, _rx(_I + r"\s+" + _ADV + r"(?:no longer|don'?t|do not)\s+live\s+in\s+" + _PLACE)),
    ("location", True, _rx(_I + r"\s+used to live\s+in\s+" + _PLACE)),
    ("location", True, _rx(_I + r"(?:\s+have|'ve|’ve)?\s+" + _ADV + r"(?:moved|am moving|'m moving|’m moving|moving)"
                           r"\s+(?:away\s+)?(?:out of|away from|from)\s+" + _PLACE)),
    ("location", False, _rx(_I + r"\s+" + _ADV + r"live\s+in\s+" + _PLACE)),
    ("location", False, _rx(_I + _BE + r"\s+" + _ADV + r"(?:living|based|settled|settling down)\s+in\s+" + _PLACE)),
    ("location", False, _rx(_I + r"(?:'ve|’ve| have)\s+been\s+living\s+in\s+" + _PLACE)),
    ("location", False, _rx(_I + r"(?:\s+have|'ve|’ve)?\s+" + _ADV + r"(?:moved|relocated)\s+(?:back\s+|over\s+|here\s+)?"
                            r"to\s+" + _PLACE)),
    ("location", False, _rx(_I + _BE + r"\s+" + _ADV + r"(?:moving|relocating)\s+(?:back\s+)?to\s+" + _PLACE)),
    ("location", False, _rx(r"\b(?:my|our)\s+(?:new\s+)?home\s+is\s+(?:now\s+)?(?:in\s+)?" + _PLACE)),
    ("location", False, _rx(r"\bhome\s+is\s+" + _PLACE + r"\s+(?:now|these days)\b")),
    ("location", False, _rx(r"(?:^|[.!]\s+)" + _PLACE + r"\s+(?:feels|is starting to feel)\s+like\s+home\b")),
    ("location", False, _rx(r"\b(?:settling|settled|unpacking)\s+(?:in|into)\s+(?:a|an|our|my|the)\s+(?:new\s+)?"
                            r"(?:house|home|place|apartment|flat|condo)\s+in\s+" + _PLACE)),
    ("location", False, _rx(r"\b(?:our|my)\s+new\s+(?:place|apartment|flat|house|home|condo)\s+in\s+" + _PLACE)),
    ("location", False, _rx(r"\blease\s+on\s+(?:a|an|our|my)\s+(?:new\s+)?(?:place|apartment|flat|house)\s+in\s+"
                            + _PLACE)),
    ("location", False, _rx(r"^\W*living\s+in\s+" + _PLACE + r"\s+has\s+been\b")),
    # job
    ("job", True, _rx(r"(?:\bi\s+|^\W*)" + _ADV + r"(?:quit|left|resigned from|lost|gave up)\s+(?:my|the)\s+"
                      r"(?:old\s+|previous\s+|day\s+)?(?:job|position|role|career)(?:\s+(?:at|as|with)\s+" + _NP + r")?")),
    ("job", True, _rx(r"\bi\s+" + _ADV + r"(?:no longer|don'?t|do not)\s+work\s+(?:at|for|as)\s+" + _NP)),
    ("job", True, _rx(r"\bi\s+(?:got|was|have been|'ve been|’ve been|just got)\s+(?:laid off|fired|let go)"
                      r"(?:\s+from\s+" + _NP + r")?")),
    ("job", True, _rx(r"\b(?:today\s+was\s+)?my\s+last\s+(?:day|shift|week)\s+(?:at|as)\s+" + _NP)),
    ("job", True, _rx(r"\bi" + _BE + r"\s+" + _ADV + r"(?:unemployed|out of work|between jobs|jobless)\b")),
    ("job", False, _rx(r"\bi(?:" + _BE + r")?\s+" + _ADV + r"(?:work|working)\s+(?:as|at|for)\s+" + _NP)),
    ("job", False, _rx(r"\bi(?:'ve|’ve| have)?\s+" + _ADV + r"(?:got|landed|accepted|started|took|began)\s+(?:a\s+|my\s+)?"
                       r"(?:new\s+|first\s+)?(?:job|position|role|offer)\s+(?:as|at|with|to be)\s+" + _NP)),
    ("job", False, _rx(r"\b(?:(?:a|my|the)\s+(?:new\s+)?position as|offer to be|(?:my|a)\s+new\s+(?:career|job) as)\s+"
                       + _NP)),
    ("job", False, _rx(r"\bi\s+" + _ADV + r"(?:start|started|starting)\s+(?:work\s+)?as\s+(?:a|an|the)\s+" + _NP)),
    ("job", False, _rx(r"\bmy\s+(?:first|new)\s+(?:week|day|month)\s+as\s+" + _NP)),
    ("job", False, _rx(r"\bi\s+(?:got|was|have been|'ve been|’ve been|just got)\s+hired\s+(?:as|at|by)\s+" + _NP)),
    ("job", False, _rx(r"\bi(?:'ve|’ve| have)?\s+" + _ADV + r"(?:been\s+|got\s+|was\s+)?promoted\s+to\s+" + _NP)),
    ("job", False, _rx(r"\bi\s+switched\s+careers?,?\s+i" + _BE + r"\s+now\s+" + _NP)),
    ("job", False, _rx(r"\bi" + _BE + r"\s+" + _ADV + r"(?:self-employed|retired)\b")),
    # relationship
    ("relationship", True, _rx(_I + r"\s+" + _ADV + r"(?:broke up|split up|separated|got divorced|divorced)"
                               r"(?:\s+(?:with|from)\s+" + _NAME + r")?")),
    ("relationship", False, _rx(r"\bi" + _BE + r"\s+" + _ADV + r"(?:dating|seeing|engaged to|married to|"
                                r"in a relationship with|going out with)\s+" + _NAME)),
    ("relationship", False, _rx(r"\bi\s+" + _ADV + r"(?:married|got engaged to|started dating|started seeing)\s+"
                                + _NAME)),
    ("relationship", False, _rx(r"\bmy\s+(?:new\s+)?(?:boyfriend|girlfriend|partner|fianc[eé]e?),?\s+" + _NAME)),
    ("relationship", False, _rx(r"\bi" + _BE + r"\s+" + _ADV + r"(?P<v>single)\b")),
    # pet (multi-valued: only withdrawals supersede)
    ("pet", True, _rx(r"(?:\b(?:my|our)\s+(?:\w+\s+){0,2}" + _PET + r",?\s+)?" + _NAME + r",?\s+"
                      r"(?:\w+\s+){0,3}?(?:passed away|died|ran away|got lost)\b")),
    ("pet", True, _rx(r"\b(?:we|i)\s+(?:had to\s+)?(?:put|say goodbye to|said goodbye to|rehomed|gave away)\s+"
                      r"(?:(?:my|our)\s+(?:\w+\s+)?" + _PET + r",?\s+)?" + _NAME)),
    ("pet", False, _rx(r"\b(?:i|we)(?:'ve|’ve| have)?\s+" + _ADV + r"(?:have|got|adopted|brought home|rescued)\s+"
                       r"(?:a|an|our|my)\s+(?:[\w-]+\s+){0,3}?" + _PET + r"\s+(?:named|called)\s+" + _NAME)),
    ("pet", False, _rx(r"\b(?:a|an)\s+(?:[\w-]+\s+){0,3}?" + _PET + r"\s+(?:named|called)\s+" + _NAME)),
    # car
    ("car", True, _rx(r"\bi\s+" + _ADV + r"(?:sold|totaled|totalled|traded in|gave away)\s+my\s+(?:old\s+)?" + _NP)),
    ("car", False, _rx(r"\bi\s+" + _ADV + r"(?:drive|am driving|'m driving|’m driving)\s+(?:a|an|my)\s+" + _NP)),
    ("car", False, _rx(r"\bi\s+get\s+around\s+in\s+(?:a|an|my)\s+" + _NP)),
    ("car", False, _rx(r"\bi" + _BE + r"\s+" + _ADV + r"the\s+(?:proud\s+)?owner\s+of\s+(?:a|an)\s+" + _NP)),
    ("car", False, _rx(r"(?:\bi\s+" + _ADV + r"|(?P<and>\band\s+(?:then\s+)?))(?:bought|got)\s+"
                       r"(?:myself\s+)?(?:a|an)\s+(?:new\s+|used\s+|brand new\s+)?" + _NP)),
    # a named trip's destination ("our anniversary trip to Lisbon")
    ("trip", False, _rx(r"\b(?:our|my|the)\s+(?P<k>[a-z]+)\s+(?:trip|vacation|getaway|holiday)\s+(?:is\s+)?"
                        r"(?:going\s+|headed\s+|now\s+)?to\s+" + _PLACE)),
    # diet
    ("diet", True, _rx(r"\bi" + _BE + r"\s+" + _ADV + r"(?:no longer|not)\s+(?:a\s+)?"
                       r"(?P<v>vegan|vegetarian|pescatarian|keto)\b")),
    ("diet", True, _rx(r"\bi\s+" + _ADV + r"(?:started eating|eat|am eating) (?:meat|fish) again\b")),
    ("diet", False, _rx(r"\bi" + _BE + r"\s+" + _ADV + r"(?:a\s+)?(?P<v>vegan|vegetarian|pescatarian|keto)\b")),
    ("diet", False, _rx(r"\bi\s+(?:went|have gone|'ve gone|’ve gone)\s+(?P<v>vegan|vegetarian|pescatarian|keto)\b")),
    # favourites
    ("favorite", False, _rx(r"\bmy\s+(?:new\s+|all-time\s+)?fav(?:ou?rite)?\s+(?P<k>[a-z]+(?: [a-z]+)?)\s+"
                            r"(?:is|has to be)\s+(?:now\s+)?" + _NP)),
    # activities (multi-valued: only withdrawals supersede)
    ("activity", True, _rx(r"\bi\s+" + _ADV + r"(?:quit|stopped|gave up|dropped(?! off)|no longer do|no longer go to|"
                           r"don'?t do|don'?t go to)\s+(?:doing\s+|going to\s+|my\s+|the\s+)?" + _NP)),
    ("activity", True, _rx(r"\b(?:we|i)\s+(?:had to\s+|have to\s+|just\s+)?(?:call(?:ed)? off|cancel(?:l?ed)?)\s+"
                           r"(?:the|our|my)\s+" + _NP)),
    ("activity", True, _rx(r"\b(?:the|our|my)\s+(?P<v>[\w-]+(?: [\w-]+){0,2})\s+(?:is|was|got|has been)\s+"
                           r"(?:cancel(?:l?ed)|called off)\b")),
    ("activity", False, _rx(r"\bi(?:'ve|’ve| have)?\s+" + _ADV + r"(?:started|took up|taken up|signed up for|joined|"
                            r"picked up|registered for)\s+(?:doing\s+|taking\s+|a\s+|an\s+|the\s+)?" + _NP)),
    ("activity", False, _rx(r"\b(?:we|i)" + _BE + r"\s+planning\s+(?:our|my|a|an|the)\s+" + _NP)),
    ("activity", False, _rx(r"\b(?:we|i)\s+booked\s+(?:our|my|a|an|the)\s+" + _NP)),
]

# Not a statement: a question, a hypothetical or wish, a plan, or negation we do not read.
_SKIP = _rx(r"\b(?:if|would|could|might|should|wish|hope|hoping|dream|dreaming|maybe|perhaps|want to|wanna|"
            r"planning to|plan to|thinking about|thinking of|considering|someday|one day|unless|whether|imagine|"
            r"pretend|never)\b")
_SENT = re.compile(r"(?<!\bSt\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bMrs\.)(?<!\bJr\.)(?<=[.!?;])\s+|\n+")
_CUT = _rx(r"[,;:!?()\"]|\.$|\s(?:and|but|because|so|since|for|now|with|as|at|in|on|last|this|these|"
           r"today|yesterday|tomorrow|which|who|where|when|while|after|before|until|instead|again|too|though|"
           r"although|just|lol|haha|right|anymore|any more|from|to|about|ago|here|there|of the week|on monday|on tuesday|"
           r"on wednesday|on thursday|on friday|on saturday|on sunday|everyday|every)\b")
_CUT_JOB = _rx(_CUT.pattern.replace("|at|", "|"))
_LEAD = _rx(r"^(?:the|a|an|my|our|his|her|their|old|previous|new|brand new|used)\s+")
_STOP_VALUES = frozenset({"it", "that", "this", "there", "here", "them", "one", "home", "work", "job", "home town",
                          "hometown", "something", "everything", "anything", "a lot", "lot", "you", "me", "us",
                          "car", "ride", "place", "town", "city", "the city", "area"})
_TOKEN = re.compile(r"[a-z0-9]+")
_OTHER_SUBJECT = _rx(r"\b(?:my|our|his|her|their)\s+(?:best\s+|old\s+|little\s+|big\s+|older\s+|younger\s+)?(?:mom|mum|mother|dad|father|sister|brother|son|daughter|kids?|"
                     r"children|friend|friends|cousin|aunt|uncle|neighbou?r|boss|coworker|colleague|partner|"
                     r"husband|wife|boyfriend|girlfriend|grandma|grandpa|grandmother|grandfather|parents?)\b"
                     r"(?:\s+[A-Z][a-z]+)?\s+(?:just\s+|finally\s+|recently\s+|now\s+|also\s+)*"
                     r"(?:lives?|moved|works?|is|got|quit|left|bought|sold|adopted|drives?|has|traded|broke)\b")


def _norm(v: str | None, keep_at: bool = False, name: bool = False) -> str | None:
    """A value as compared: lowercased, cut at clause words and punctuation (``keep_at``: not at
    "at", so a job keeps its employer), leading articles off (``name``: kept, "New York")."""
    if v is None:
        return None
    v = " ".join(v.replace("’", "'").split())
    cut = _CUT_JOB if keep_at else _CUT
    m = cut.search(" " + v)
    if m:
        v = (" " + v)[: m.start()].strip()
    v = v.lower()
    for _ in range(0 if name else 3):
        v2 = _LEAD.sub("", v)
        if v2 == v:
            break
        v = v2
    v = v.strip(" .'-")
    return v or None


def same_value(a: str | None, b: str | None) -> bool:
    """Whether two normalised values name the same thing: equal, or one's words contain all of the
    other's ("berlin" / "berlin germany"); ``None`` (unnamed) matches anything."""
    if a is None or b is None:
        return True
    if a == b:
        return True
    ta, tb = set(_TOKEN.findall(a)), set(_TOKEN.findall(b))
    if not ta or not tb:
        return False
    return ta <= tb or tb <= ta


def statements(text: str, speaker: str | None = None) -> list[Statement]:
    """The first-person slot statements of ``text`` said by ``speaker`` (see the module doc).

    Parameters
    ----------
    text : str
        One turn (several sentences are read one at a time).
    speaker : str, optional
        Who says it (a name or a role); the statements' subject, lowercased (default ``"user"``).

    Returns
    -------
    list of Statement
        In text order; at most one per (attribute, value, negated) per turn.
    """
    if not isinstance(text, str):
        raise bad_arg("text", "a str", type(text).__name__, MemkernTypeError)
    if speaker is not None and not isinstance(speaker, str):
        raise bad_arg("speaker", "a str or None", type(speaker).__name__, MemkernTypeError)
    subject = " ".join((speaker or "user").lower().split()) or "user"
    out: list[Statement] = []
    seen: set[tuple] = set()
    for sent in _SENT.split(text.replace("’", "'")):
        s = sent.strip()
        if not s or s.endswith("?") or _SKIP.search(s) or _OTHER_SUBJECT.search(s):
            continue
        taken: list[tuple[int, int]] = []
        for attr, neg, rx in _PATTERNS:
            for m in rx.finditer(s):
                if any(a < m.end() and m.start() < b for a, b in taken):
                    continue
                if m.groupdict().get("and") and not re.search(r"\bi\b", s[: m.start()], re.I):
                    continue  # "... and bought a ..." needs an "I" before it
                raw = m.groupdict().get("v")
                value = _norm(raw, keep_at=attr == "job", name=attr in ("location", "pet", "relationship")) \
                    if raw is not None else None
                if raw is not None and (value is None or value in _STOP_VALUES):
                    if not neg:
                        continue
                    value = None  # "I sold my car": a withdrawal naming no value
                if attr == "car" and not neg and (value is None or not _VEHICLE.search(value)):
                    continue
                a = attr
                if attr in ("favorite", "trip"):
                    a = f"{attr}:{m.group('k').lower()}"
                if attr == "job" and not neg and raw is None:  # "I'm retired / self-employed"
                    value = re.search(r"self-employed|retired", m.group(0), re.I).group(0).lower()
                key = (a, value, neg)
                end = m.end()
                if raw is not None:  # the value ends where it was cut ("my car and bought a ...")
                    cut = (_CUT_JOB if attr == "job" else _CUT).search(" " + raw)
                    if cut is not None:
                        end = m.start("v") + max(cut.start() - 1, 0)
                taken.append((m.start(), end))
                if key in seen:
                    continue
                seen.add(key)
                out.append(Statement(subject, a, value, neg, s))
    return out


def contradicts(new: Statement, old: Statement) -> bool:
    """Whether ``new`` (said later) makes ``old`` stale (see the module doc)."""
    if new.subject != old.subject or new.attribute != old.attribute or old.negated:
        return False
    base = new.attribute.split(":")[0]
    if new.negated:
        return same_value(new.value, old.value) if base in SINGLE_VALUED else \
            (new.value is not None and old.value is not None and _overlaps(new.value, old.value))
    if base in SINGLE_VALUED:
        return not same_value(new.value, old.value)
    return False


_WEAK = frozenset({"class", "classes", "lesson", "lessons", "course", "club", "group", "team", "my", "the", "a",
                   "of", "on", "in", "at", "and", "weekly", "old", "new"})


def _overlaps(a: str, b: str) -> bool:
    """Two multi-valued values share a content word ("pottery" / "pottery class on tuesdays")."""
    ta = set(_TOKEN.findall(a)) - _WEAK
    tb = set(_TOKEN.findall(b)) - _WEAK
    return bool(ta & tb)


def find_contradictions(new: Sequence[Statement], old: Iterable[tuple[object, Statement]]
                        ) -> list[tuple[object, Statement, Statement]]:
    """``(old key, new statement, old statement)`` for every earlier statement a new one makes
    stale; ``old`` is ``(key, statement)`` pairs (e.g. a turn record id and what it says)."""
    by_slot: dict[tuple[str, str], list[Statement]] = {}
    for s in new:
        by_slot.setdefault((s.subject, s.attribute), []).append(s)
    out = []
    for key, o in old:
        for s in by_slot.get((o.subject, o.attribute), ()):
            if contradicts(s, o):
                out.append((key, s, o))
                break
    return out
