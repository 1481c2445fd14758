"""Generated multi-session histories with exact evidence labels (LongMemEval-like).

A simulated user talks to an assistant over many dated sessions. The user's facts (car,
employer, city, pet, weekly class, race goal), plans (a trip that may change or be called off),
preferences (diet, music, reading, travel, drinks) and recurring events (concerts, hikes, baking,
museum visits) appear, evolve, get updated or withdrawn across sessions, interleaved with
unrelated chit-chat, with small talk about the same topics that does *not* state the fact
("my car's check-engine light came on"), and with the same kinds of facts about other people
("my sister Emma just bought a red Mazda 3") that share the vocabulary of the real evidence.
Questions are paraphrased away from the wording of their evidence.

Question types follow LongMemEval's names: ``single-session-user`` (a fact stated once),
``knowledge-update`` (a fact stated, then changed or withdrawn; evidence = every statement, the
answer is the latest), ``multi-session`` (count events spread over sessions; evidence = every
event turn), ``temporal-reasoning`` (which of two dated facts came first; evidence = both turns),
``single-session-preference`` (a request whose good answer depends on a stated preference;
evidence = that statement). Evidence labels are exact by construction: they are the user turns
the generator wrote to state the answer, and nothing else states it (assistant replies never
repeat the value).

Everything is drawn from one ``numpy.random.Generator`` seeded by ``seed``: the same arguments
always give the same dataset (same ids, same text). Generation is linear in the number of
sessions (10,000 sessions take a few seconds).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import bad_arg
from ..base.validate import check_float, check_int
from .schema import Conversation, Dataset, Question, Session, Turn

__all__ = ["generate_history", "QUESTION_TYPES"]

QUESTION_TYPES = ("single-session-user", "knowledge-update", "multi-session", "temporal-reasoning",
                  "single-session-preference")

_FIRST = ["Emma", "Liam", "Olivia", "Noah", "Ava", "Mateo", "Sofia", "Ethan", "Maya", "Lucas", "Chloe",
          "Arjun", "Priya", "Daniel", "Grace", "Omar", "Hana", "Leo", "Zoe", "Ivan", "Nora", "Kai", "Ruth", "Sam"]
_RELS = ["sister", "brother", "coworker", "neighbor", "best friend", "cousin", "roommate", "boss", "mom", "dad"]

# --------------------------------------------------------------------------------------------
# Mutable facts ("slots"). {v} = value. 'other' lines state the same kind of fact about someone
# else (distractors with overlapping vocabulary); 'chatter' lines are about the user's own slot
# without stating its value (also distractors).
# --------------------------------------------------------------------------------------------
_SLOTS: dict[str, dict[str, Any]] = {
    "car": dict(
        values=["a silver Honda Civic", "a blue Subaru Outback", "a used Toyota Prius", "a red Mazda 3",
                "a black Ford Ranger", "a white Tesla Model 3", "a green Volkswagen Golf", "a grey Hyundai Tucson"],
        state=["I finally picked up my own set of wheels last weekend, {v}.",
               "These days I get around in {v}, and honestly it handles the highway really well.",
               "Quick life update: I'm now the proud owner of {v}."],
        update=["I ended up trading in my old ride, so now I drive {v}.",
                "Big change, I sold my previous car and bought {v}."],
        other=["My {rel} {name} just bought {v} and won't stop talking about it.",
               "{name}, my {rel}, is thinking about getting {v}.",
               "My {rel} {name} crashed {v} into a pole, nobody got hurt thankfully."],
        chatter=["The check-engine light came on again this morning on the way in.",
                 "How often should tires really be rotated? Mine look worn.",
                 "Parking downtown is a nightmare, I circled for twenty minutes today.",
                 "I need to get an oil change before the road trip season."],
        reply=["Congrats! Regular maintenance will keep it running smoothly for years.",
               "That's exciting, a reliable vehicle makes commuting so much easier.",
               "Nice. Keep an eye on the tire pressure when it gets cold."],
        question=["Which vehicle do I own right now?", "What am I driving these days?"],
        temporal="getting {v}"),
    "job": dict(
        values=["a data analyst at Brightwave Logistics", "a nurse at St. Mary's Hospital",
                "a junior architect at Foster & Lane", "a product manager at Nimbus Software",
                "a chemistry teacher at Ridgeview High", "an accountant at Parker Consulting",
                "a UX designer at Lumen Labs", "a paralegal at Hart & Ruiz"],
        state=["I just started a new position as {v}.", "Work news: I accepted an offer to be {v}.",
               "My first week as {v} went better than expected."],
        update=["I left my old job, and I'm working as {v} now.", "I switched careers, I'm now {v}."],
        other=["My {rel} {name} got hired as {v}.", "{name}, my {rel}, just interviewed to be {v}.",
               "My {rel} {name} quit being {v} after three years."],
        chatter=["My manager scheduled another meeting that could have been an email.",
                 "The commute to the office is wearing me out.",
                 "We have a big deadline at work on Friday and I'm stressed.",
                 "I'm thinking of asking for a raise at my performance review."],
        reply=["That's a big step, congratulations! How are your new colleagues?",
               "Starting somewhere new is always a mix of excitement and nerves.",
               "It sounds like a good fit for your skills."],
        question=["Where am I employed at the moment, and in what role?", "What do I do for a living currently?"],
        temporal="starting as {v}"),
    "city": dict(
        values=["Portland", "Austin", "Denver", "Boston", "Chicago", "San Diego", "Minneapolis", "Raleigh",
                "Pittsburgh", "Tucson"],
        state=["We finally finished unpacking in our new apartment in {v}.",
               "Living in {v} has been an adjustment, but I like our neighborhood.",
               "We signed the lease on a place in {v} last month."],
        update=["We moved again! We're settling into a house in {v} now.",
                "We relocated for good, home is {v} these days."],
        other=["My {rel} {name} just relocated to {v}.", "{name}, my {rel}, keeps telling me to move to {v}.",
               "My {rel} {name} grew up in {v}."],
        chatter=["Our landlord still hasn't fixed the leaky faucet.",
                 "The neighborhood is noisy on weekends but the rent is fair.",
                 "I'm looking for a good local bakery around here."],
        reply=["A new home takes a while to feel settled, give it a few months.",
               "That sounds lovely, exploring a new area is half the fun.",
               "Moving is exhausting, I hope the unpacking is nearly done."],
        question=["Which city is my home base currently?", "Where do I live right now?"],
        temporal="moving to {v}"),
    "class": dict(
        values=["pottery on Tuesday evenings", "salsa dancing on Thursday nights", "Spanish lessons on Monday mornings",
                "rock climbing on Wednesdays", "a watercolor workshop on Saturdays", "improv comedy on Sunday afternoons"],
        state=["I signed up for {v}, first session was fun.", "I've started taking {v} to get out of the house."],
        update=["I dropped my old class and now do {v} instead.", "New schedule: I switched to {v}."],
        other=["My {rel} {name} is taking {v}.", "{name}, my {rel}, wants me to join {v} with them."],
        chatter=["I was too tired to go to class this week.", "The instructor at my class is really patient."],
        reply=["Learning something new every week is such a good habit.",
               "That sounds like a fun way to meet people."],
        question=["What course am I enrolled in and when does it meet?", "Which weekly lesson do I attend?"],
        temporal="starting {v}"),
    "race": dict(
        values=["a half marathon in October", "a 10k trail race in June", "a hundred-mile charity bike ride",
                "a sprint triathlon in August", "a 5k color run in May", "an ocean swim in September"],
        state=["I registered for {v}, so the training plan starts now.", "I committed to {v}, wish me luck."],
        update=["I changed my goal, I'm now training for {v}.", "Scrapped the old plan, now it's {v}."],
        other=["My {rel} {name} is training for {v}.", "{name}, my {rel}, just finished {v}."],
        chatter=["My legs are sore from the long workout yesterday.", "I need new running shoes soon."],
        reply=["Having a goal on the calendar really helps with motivation.",
               "Remember to build up gradually and rest enough."],
        question=["What endurance event am I preparing for?", "Which athletic competition am I getting ready for?"],
        temporal="signing up for {v}"),
    "trip": dict(
        values=["Lisbon", "Kyoto", "Reykjavik", "Mexico City", "Vancouver", "Marrakech", "Athens", "Hanoi"],
        state=["We're planning our anniversary trip to {v} this year.",
               "For our anniversary we booked flights to {v}."],
        update=["Change of plans, the anniversary trip is going to {v} instead.",
                "We rebooked the anniversary getaway, it's {v} now."],
        withdraw=["We had to call off the anniversary trip entirely, money is tight this year.",
                  "Sad news, the anniversary getaway is cancelled, we're staying home."],
        other=["My {rel} {name} is flying to {v} next month.", "{name}, my {rel}, loved their vacation in {v}."],
        chatter=["I need to renew my passport at some point.", "Airfare prices are ridiculous right now."],
        reply=["An anniversary trip is such a nice way to celebrate.", "Travel plans always need some flexibility."],
        question=["Where are we heading for the anniversary celebration?",
                  "What's the destination of our anniversary vacation?"],
        temporal="planning the trip to {v}"),
    "pet": dict(
        values=["a beagle named Biscuit", "a tabby cat named Miso", "a golden retriever named Sunny",
                "a rescue greyhound named Pepper", "a parrot named Kiwi", "a rabbit named Clover",
                "a corgi named Waffles", "a black cat named Shadow"],
        state=["We brought home {v} from the shelter on Saturday.", "Meet the newest family member: {v}."],
        other=["My {rel} {name} adopted {v}.", "{name}, my {rel}, is pet-sitting {v} this week."],
        chatter=["The vet bill this month was higher than I expected.",
                 "I'm trying to find a good pet sitter for when we travel."],
        reply=["How wonderful! The first weeks with a new animal are so special.",
               "Adopting from a shelter is such a kind thing to do."],
        question=["What animal did I adopt and what's its name?", "Tell me about my pet: what kind and what name?"],
        temporal="adopting {v}"),
}
_UPDATABLE = ["car", "job", "city", "class", "race", "trip"]

_PREFS: dict[str, dict[str, Any]] = {
    "diet": dict(
        values={"vegetarian": "I haven't eaten meat in two years, so keep me away from anything with chicken or beef.",
                "vegan": "I cut out all animal products last year, dairy and eggs included.",
                "gluten-free": "My doctor confirmed I'm celiac, so anything with wheat is off the table for me.",
                "pescatarian": "The only meat I still eat is fish and seafood."},
        other="My {rel} {name} eats {v} food only.",
        question="Can you suggest something I could cook for dinner this weekend?",
        answer="a {v} recipe"),
    "music": dict(
        values={"jazz": "Lately I can't stop playing old Coltrane and Miles Davis records.",
                "classic rock": "All I play in the car is Led Zeppelin and the Stones these days.",
                "k-pop": "I've been obsessed with BTS and Blackpink songs for months.",
                "bluegrass": "Banjo and fiddle music is what I put on to relax."},
        other="My {rel} {name} only listens to {v}.",
        question="Any ideas for songs to put on a playlist for my drive?",
        answer="{v} songs"),
    "reading": dict(
        values={"science fiction": "Before bed I always read novels about space travel and distant futures.",
                "biographies": "My favorite books are life stories of historical figures.",
                "cozy mysteries": "I love gentle whodunits set in small villages.",
                "poetry": "A few poems before sleep is my nightly ritual."},
        other="My {rel} {name} reads {v} constantly.",
        question="What book should I pick up next?",
        answer="a {v} book"),
    "lodging": dict(
        values={"budget hostels": "When I travel I'd rather save money, shared dorms are fine by me.",
                "luxury resorts": "On vacation I want a spa, room service and a pool, no compromises.",
                "camping": "My ideal vacation night is in a tent under the stars.",
                "vacation rentals": "I like renting a whole apartment with a kitchen when I'm away."},
        other="My {rel} {name} always books {v}.",
        question="Could you recommend where I should stay on my next getaway?",
        answer="{v}"),
    "drink": dict(
        values={"oat milk lattes": "My morning order is always something with oat milk and espresso.",
                "black cold brew": "I take my coffee iced and black, nothing added.",
                "green tea": "I gave up coffee, I only drink matcha and sencha now.",
                "hot chocolate": "I can't handle caffeine, so it's cocoa for me at cafés."},
        other="My {rel} {name} drinks {v} every morning.",
        question="I'm heading to a café, what should I order?",
        answer="{v}"),
}
_PREF_REPLY = ["Good to know, I'll keep that in mind.", "Thanks for sharing, that's helpful to remember.",
               "Noted! Everyone has their own taste."]

_EVENTS: dict[str, dict[str, Any]] = {
    "concert": dict(
        values=["Arctic Monkeys", "Taylor Swift", "Kendrick Lamar", "Coldplay", "Norah Jones", "Metallica",
                "Billie Eilish", "the local symphony"],
        state=["I went to see {v} live last night, what a show.", "Caught {v} in concert on Friday, my ears are still ringing."],
        other="My {rel} {name} went to a {v} concert.",
        near=["Tickets for {v} went on sale today but they're way too expensive for me.",
              "I almost bought tickets to see {v} live, maybe next tour."],
        question="How many live music shows have I attended?", temporal="seeing {v} live"),
    "hike": dict(
        values=["Eagle Ridge trail", "the Falls loop", "Cedar Peak", "the canyon rim trail", "Bear Lake path",
                "the coastal bluff trail"],
        state=["I hiked {v} this morning, about six miles round trip.", "Did {v} today, the views were worth the climb."],
        other="My {rel} {name} hiked {v} last weekend.",
        near=["I wanted to hike {v} this morning but it rained, so I stayed in.",
              "Someone told me {v} is a great hike, I should try it eventually."],
        question="How many hikes have I told you I went on?", temporal="hiking {v}"),
    "baking": dict(
        values=["sourdough bread", "a lemon tart", "cinnamon rolls", "a carrot cake", "banana muffins", "focaccia"],
        state=["I baked {v} from scratch today and it actually turned out.", "Spent the afternoon making {v} in the oven."],
        other="My {rel} {name} baked {v} for the party.",
        near=["I'm craving {v}, maybe I'll just buy some from the store.",
              "I found a recipe for {v} but haven't had time to make it."],
        question="How many times did I mention baking something at home?", temporal="baking {v}"),
    "museum": dict(
        values=["the natural history museum", "the modern art museum", "the science center", "the maritime museum",
                "the photography gallery", "the railway museum"],
        state=["I spent Sunday afternoon at {v}.", "Finally visited {v}, the exhibits were amazing."],
        other="My {rel} {name} dragged the kids to {v}.",
        near=["{v} has a new exhibit, I might check it out someday.",
              "I drove past {v} today, it's closed for renovation."],
        question="How many museum or gallery visits have I mentioned?", temporal="visiting {v}"),
}
_EVENT_REPLY = ["That sounds like a great day!", "What a fun way to spend your time.", "I'm glad you enjoyed it."]

_CHITCHAT = [
    ("The weather has been {w} all week.", "Hopefully it turns nicer soon, weather really affects the mood."),
    ("I watched a documentary about {t} last night.", "Documentaries are a great way to learn something new."),
    ("I couldn't sleep well, kept waking up at {h} am.", "Poor sleep is rough. A consistent bedtime can help."),
    ("Did you hear about the {t} story in the news?", "I don't follow the news live, but I'm happy to discuss it."),
    ("My {rel} {name} called me for an hour about nothing.", "Long calls with family can be nice, even about nothing."),
    ("I'm trying to drink more water this month.", "Small habits like that add up over time."),
    ("What's a good way to stay focused in the afternoon?", "Short breaks, a walk, and less sugar at lunch usually help."),
    ("I repainted the {room} over the weekend.", "A fresh coat of paint changes a room completely."),
    ("The {team} lost again, I can't believe it.", "Sports can be heartbreaking. There's always next season."),
    ("I need a new show to binge, something about {t}.", "There are plenty of good series on that, depending on your mood."),
    ("Can you explain how compound interest works?", "Interest is earned on the principal and on earlier interest, so growth accelerates."),
    ("I'm cleaning out my closet and donating old clothes.", "Decluttering feels great once it's done."),
    ("Grocery prices are getting out of hand.", "Planning meals ahead can cut the bill a bit."),
    ("I've been journaling every night for a week.", "Journaling is a good way to process the day."),
    ("My {room} smells like paint still.", "Keep the windows open and it should fade in a few days."),
    ("Recommend a quick breakfast idea?", "Overnight oats or yogurt with fruit are quick and filling."),
]
_FILL = dict(w=["rainy", "freezing", "humid", "windy", "gorgeous", "grey"],
             t=["octopuses", "Roman history", "deep sea vents", "bees", "volcanoes", "chess", "jazz history",
                "space probes", "ancient Egypt", "the stock market"],
             h=["3", "4", "2", "5"], room=["bedroom", "kitchen", "hallway", "bathroom", "office"],
             team=["Mariners", "Rangers", "Bulls", "Celtics", "Broncos", "Giants"])
_OPENERS = ["", "", "", "Ugh, long day. ", "Hey again! ", "So, ", "Random thing: ", "Oh, before I forget, "]
_CLOSERS = ["", "", "", " Anyway, how's your day going?", " Just wanted to share.", " Crazy, right?"]


@dataclass
class _Item:
    """One user payload segment scheduled into a session."""

    kind: str            # slot | pref | event
    key: str             # slot / pref / event name
    text: str
    reply: str
    tag: tuple = ()      # identifies what the segment states
    turn_id: str = ""   # set when placed


@dataclass
class _User:
    name: str
    people: list[tuple[str, str]] = field(default_factory=list)  # (rel, name)


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _fmt_date(d: _dt.datetime) -> str:
    return d.strftime("%Y/%m/%d (%a) %H:%M")


def _other_line(rng, user: _User, template: str, v: str) -> str:
    rel, name = _pick(rng, user.people)
    return template.format(rel=rel, name=name, v=v)


def _fill(rng, s: str, user: _User) -> str:
    rel, name = _pick(rng, user.people)
    kw = {k: _pick(rng, v) for k, v in _FILL.items()}
    return s.format(rel=rel, name=name, **kw)


def generate_history(n_users: int = 4, sessions_per_user: int = 30, seed: int = 0, *,
                     segments_per_session: tuple[int, int] = (2, 4), p_other: float = 1.2,
                     p_chatter: float = 0.6, p_update: float = 0.55, p_same_value: float = 0.5, start_date: str = "2024/01/08",
                     name: str | None = None) -> Dataset:
    """Generate a multi-session dataset with exact evidence labels.

    Parameters
    ----------
    n_users : int
        Number of simulated users (one :class:`Conversation` each), >= 1.
    sessions_per_user : int
        Sessions in each user's history, >= 4. ``n_users * sessions_per_user`` may be 10,000+.
    seed : int
        All randomness comes from ``numpy.random.default_rng(seed)``.
    segments_per_session : (int, int)
        Inclusive range of topical segments (2 or 4 turns each) per session.
    p_other : float
        Mean number (Poisson) per session of distractor facts about other people, or of the user
        talking about an event without having done it (same vocabulary as the evidence).
    p_chatter : float
        Mean number (Poisson) per session of small-talk exchanges about one of the user's own
        topics that do not state the fact.
    p_same_value : float
        Probability that a distractor reuses one of the user's own values ("my sister also
        drives a red Mazda 3"): the hardest negatives.
    p_update : float
        Probability that an updatable fact (car, job, city, class, race, trip) is changed at least
        once later in the history (and, for the trip, possibly withdrawn).
    start_date : str
        Date of the first session, ``YYYY/MM/DD``.

    Returns
    -------
    Dataset
        ``meta`` holds the generator arguments. Turn ids are ``"<session_id>#<turn index>"``;
        session ids ``"u<user>_s<index>"``.
    """
    n_users = check_int("n_users", n_users, 1)
    sessions_per_user = check_int("sessions_per_user", sessions_per_user, 4)
    lo, hi = segments_per_session
    if not (1 <= lo <= hi):
        raise bad_arg("segments_per_session", "(lo, hi) with 1 <= lo <= hi", segments_per_session)
    for nm, p in (("p_update", p_update), ("p_same_value", p_same_value)):
        check_float(nm, p, 0, 1, expected="a probability in [0, 1]")
    for nm, p in (("p_other", p_other), ("p_chatter", p_chatter)):
        check_float(nm, p, 0, 20, expected="a mean count in [0, 20]")
    try:
        t0 = _dt.datetime.strptime(start_date, "%Y/%m/%d")
    except (TypeError, ValueError):
        raise bad_arg("start_date", "a date 'YYYY/MM/DD'", start_date) from None
    rng = np.random.default_rng(seed)
    convs = [_gen_user(rng, u, int(sessions_per_user), (lo, hi), float(p_other), float(p_chatter),
                       float(p_update), float(p_same_value), t0) for u in range(int(n_users))]
    meta = dict(generator="memkern.data.synthetic", n_users=int(n_users), sessions_per_user=int(sessions_per_user),
                seed=int(seed), segments_per_session=[lo, hi], p_other=p_other, p_chatter=p_chatter,
                p_update=p_update, p_same_value=p_same_value, start_date=start_date)
    ds = Dataset(name or f"generated-u{n_users}-s{sessions_per_user}-seed{seed}", convs, meta)
    ds.validate()
    return ds


def _gen_user(rng, u: int, S: int, seg_range, p_other, p_chatter, p_update, p_same_value, t0) -> Conversation:
    uname = _pick(rng, _FIRST)
    others = [n for n in _FIRST if n != uname]
    people = [(_RELS[i % len(_RELS)], others[int(j)]) for i, j in
              enumerate(rng.choice(len(others), size=6, replace=False))]
    user = _User(uname, people)
    cid = f"u{u}"
    # ---- schedule payload items: session index -> list of items --------------------------------
    sched: dict[int, list[_Item]] = {}
    facts: list[dict[str, Any]] = []  # for questions

    def place(item: _Item, lo: int, hi: int) -> int:
        # prefer sessions with few payload items so one session holds at most ~2
        for _ in range(8):
            s = int(rng.integers(lo, max(lo + 1, hi)))
            if len(sched.get(s, [])) < 2:
                break
        sched.setdefault(s, []).append(item)
        return s

    for key, spec in _SLOTS.items():
        vals = list(rng.permutation(spec["values"]))
        v0 = vals.pop()
        first_hi = max(1, int(S * 0.5))
        it0 = _Item("slot", key, _pick(rng, spec["state"]).format(v=v0), _pick(rng, spec["reply"]), (key, 0, v0))
        s0 = place(it0, 0, first_hi)
        chain = [(s0, it0, v0)]
        if key in _UPDATABLE and rng.random() < p_update:
            n_up = 1 + int(rng.random() < 0.3)
            prev = s0
            for k in range(n_up):
                lo_s = prev + 1
                if lo_s >= S:
                    break
                withdraw = key == "trip" and k == n_up - 1 and rng.random() < 0.4
                if withdraw:
                    v = "the trip was cancelled"
                    text = _pick(rng, spec["withdraw"])
                else:
                    v = vals.pop()
                    text = _pick(rng, spec["update"]).format(v=v)
                it = _Item("slot", key, text, _pick(rng, spec["reply"]), (key, k + 1, v))
                s = place(it, lo_s, min(S, lo_s + max(2, S // 2)))
                chain.append((s, it, v))
                prev = s
        facts.append(dict(kind="slot", key=key, chain=chain))
    for key, spec in _PREFS.items():
        v = _pick(rng, list(spec["values"]))
        it = _Item("pref", key, spec["values"][v], _pick(rng, _PREF_REPLY), (key, v))
        s = place(it, 0, S)
        facts.append(dict(kind="pref", key=key, chain=[(s, it, v)]))
    for key, spec in _EVENTS.items():
        n_ev = int(rng.integers(2, 6)) if S >= 12 else 2
        n_ev = max(2, min(n_ev + (S // 60), len(spec["values"])))
        vals = list(rng.permutation(spec["values"]))[:n_ev]
        chain = []
        for v in vals:
            it = _Item("event", key, _pick(rng, spec["state"]).format(v=v), _pick(rng, _EVENT_REPLY), (key, v))
            chain.append((place(it, 0, S), it, v))
        facts.append(dict(kind="event", key=key, chain=chain))
    # distractor candidates: (template kind, key)
    other_pool: list[tuple[str, str]] = [("slot", k) for k in _SLOTS] + [("pref", k) for k in _PREFS] + \
        [("event", k) for k in _EVENTS]
    # ---- write sessions ----------------------------------------------------------------------
    user_values: dict[str, list[str]] = {}
    for f in facts:
        vals = [c[2] for c in f["chain"] if c[2] != "the trip was cancelled"]
        user_values[f["key"]] = vals
    sessions: list[Session] = []
    when = t0 + _dt.timedelta(hours=int(rng.integers(8, 20)))
    for si in range(S):
        sid = f"{cid}_s{si}"
        date = _fmt_date(when)
        segs: list[list[tuple[str, str, _Item | None]]] = []
        for it in sched.get(si, []):
            seg = [("user", _pick(rng, _OPENERS) + it.text + _pick(rng, _CLOSERS), it), ("assistant", it.reply, None)]
            segs.append(seg)
        for _ in range(int(rng.poisson(p_other))):
            kind, key = other_pool[int(rng.integers(len(other_pool)))]
            own = user_values.get(key, [])
            same = bool(own) and rng.random() < p_same_value  # hard negative: the user's own value
            if kind == "slot":
                spec = _SLOTS[key]
                v = _pick(rng, own) if same else _pick(rng, spec["values"])
                line = _other_line(rng, user, _pick(rng, spec["other"]), v)
                rep = _pick(rng, spec["reply"])
            elif kind == "pref":
                spec = _PREFS[key]
                line = _other_line(rng, user, spec["other"], _pick(rng, own) if same else _pick(rng, list(spec["values"])))
                rep = _pick(rng, _PREF_REPLY)
            else:
                spec = _EVENTS[key]
                v = _pick(rng, own) if same else _pick(rng, spec["values"])
                if rng.random() < 0.5:  # the user talks about the event without having done it
                    line = _pick(rng, spec["near"]).format(v=v)
                else:
                    line = _other_line(rng, user, spec["other"], v)
                rep = _pick(rng, _EVENT_REPLY)
            segs.append([("user", _pick(rng, _OPENERS) + line, None), ("assistant", rep, None)])
        for _ in range(int(rng.poisson(p_chatter))):
            key = _pick(rng, list(_SLOTS))
            spec = _SLOTS[key]
            segs.append([("user", _pick(rng, spec["chatter"]), None), ("assistant", _pick(rng, spec["reply"]), None)])
        n_seg = int(rng.integers(seg_range[0], seg_range[1] + 1))
        cc = rng.permutation(len(_CHITCHAT))
        while len(segs) < n_seg:
            u_line, a_line = _CHITCHAT[int(cc[len(segs) % len(cc)])]
            seg = [("user", _fill(rng, u_line, user), None), ("assistant", _fill(rng, a_line, user), None)]
            if rng.random() < 0.4:  # a follow-up exchange in the same topic
                seg += [("user", _pick(rng, ["Makes sense.", "Good point, thanks.", "I'll try that.",
                                             "Yeah, I figured.", "Any other tips?"]), None),
                        ("assistant", _pick(rng, ["Happy to help!", "Let me know how it goes.",
                                                  "Anytime, just ask."]), None)]
            segs.append(seg)
        order = rng.permutation(len(segs))
        sess = Session(sid, date)
        for oi in order:
            for role, text, it in segs[int(oi)]:
                k = len(sess.turns)
                t = Turn(f"{sid}#{k}", role, text, sid, k, date, role, it is not None)
                if it is not None:
                    it.turn_id = t.turn_id
                sess.turns.append(t)
        sessions.append(sess)
        when = when + _dt.timedelta(days=int(rng.integers(1, 5)), hours=int(rng.integers(-3, 4)))
    qdate = _fmt_date(when)
    # ---- questions -----------------------------------------------------------------------------
    questions: list[Question] = []
    sid_of = {t.turn_id: t.session_id for s in sessions for t in s.turns}

    def add_q(qtype: str, text: str, answer: str, items: list[_Item]):
        ev = [it.turn_id for it in items]
        ev_s: list[str] = []
        for e in ev:
            if sid_of[e] not in ev_s:
                ev_s.append(sid_of[e])
        questions.append(Question(f"{cid}/q{len(questions)}", text, answer, qtype, ev, ev_s, qdate, cid))

    dated: list[tuple[int, str, _Item]] = []  # (session, description, item) for temporal questions
    for f in facts:
        chain = sorted(f["chain"], key=lambda x: (x[0], x[1].turn_id))
        if f["kind"] == "slot":
            spec = _SLOTS[f["key"]]
            qtype = "knowledge-update" if len(chain) > 1 else "single-session-user"
            add_q(qtype, _pick(rng, spec["question"]), chain[-1][2], [c[1] for c in chain])
            dated.append((chain[0][0], spec["temporal"].format(v=chain[0][2]), chain[0][1]))
        elif f["kind"] == "pref":
            spec = _PREFS[f["key"]]
            add_q("single-session-preference", spec["question"], spec["answer"].format(v=chain[0][2]), [chain[0][1]])
        else:
            spec = _EVENTS[f["key"]]
            add_q("multi-session", spec["question"], str(len(chain)), [c[1] for c in chain])
            for c in chain[:2]:
                dated.append((c[0], spec["temporal"].format(v=c[2]), c[1]))
    n_temp = min(3 + S // 40, len(dated) // 2)
    used: set[int] = set()
    for _ in range(n_temp * 4):
        if n_temp <= 0:
            break
        i, j = (int(x) for x in rng.choice(len(dated), size=2, replace=False))
        a, b = dated[i], dated[j]
        if a[0] == b[0] or i in used or j in used:
            continue
        used.update((i, j))
        first = a if a[0] < b[0] else b
        add_q("temporal-reasoning", f"Which came earlier: {a[1]} or {b[1]}?", first[1],
              sorted([a[2], b[2]], key=lambda it: it.turn_id))
        n_temp -= 1
    return Conversation(cid, sessions, questions)
