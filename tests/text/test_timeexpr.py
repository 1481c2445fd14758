"""memkern.text.time: time expressions in questions -> event-time ranges and the soft time prior."""
from __future__ import annotations

import datetime as dt
import time

import numpy as np
import pytest

from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.text.time import (DAY, TimeQuery, mentioned_time, parse_time, rescore, resolve_now,
                        time_prior_scores)

UTC = dt.timezone.utc


def ts(y, m, d, h=0, tz=UTC):
    return dt.datetime(y, m, d, h, tzinfo=tz).timestamp()


def rng(text, now, **kw):
    """(start, end) of the parse as dates (UTC), None for an open side."""
    q = parse_time(text, now, **kw)
    f = lambda t: None if t is None else dt.datetime.fromtimestamp(t, UTC).date()
    return f(q.start), f(q.end)


D = dt.date

CASES = [
    # absolute
    ("What did she do on May 3, 2023?", "2023-10-22", (D(2023, 5, 3), D(2023, 5, 4))),
    ("on 3 May 2023", "2023-10-22", (D(2023, 5, 3), D(2023, 5, 4))),
    ("on the 3rd of May, 2023", "2023-10-22", (D(2023, 5, 3), D(2023, 5, 4))),
    ("May 3rd, 2023", "2023-10-22", (D(2023, 5, 3), D(2023, 5, 4))),
    ("on 2023-05-03", "2023-10-22", (D(2023, 5, 3), D(2023, 5, 4))),
    ("on 2023/05/20 (Sat)", "2023-10-22", (D(2023, 5, 20), D(2023, 5, 21))),
    ("in May 2023", "2023-10-22", (D(2023, 5, 1), D(2023, 6, 1))),
    ("in May, 2023", "2023-10-22", (D(2023, 5, 1), D(2023, 6, 1))),
    ("April.2023", "2023-10-22", (D(2023, 4, 1), D(2023, 5, 1))),
    ("in December 2022", "2023-10-22", (D(2022, 12, 1), D(2023, 1, 1))),
    ("in 2022", "2023-10-22", (D(2022, 1, 1), D(2023, 1, 1))),
    ("the summer of 2022", "2023-10-22", (D(2022, 6, 1), D(2022, 9, 1))),
    ("in the winter of 2022", "2023-10-22", (D(2022, 12, 1), D(2023, 3, 1))),
    ("in the 1990s", "2023-10-22", (D(1990, 1, 1), D(2000, 1, 1))),
    ("in the 90s", "2023-10-22", (D(1990, 1, 1), D(2000, 1, 1))),
    ("early May 2023", "2023-10-22", (D(2023, 5, 1), D(2023, 5, 11))),
    ("late 2022", "2023-10-22", (D(2022, 9, 1), D(2023, 1, 1))),
    ("Christmas 2021", "2023-10-22", (D(2021, 12, 24), D(2021, 12, 27))),
    # a month / day without a year: its latest occurrence begun by now
    ("When did Melanie go camping in June?", "2023-10-22", (D(2023, 6, 1), D(2023, 7, 1))),
    ("in December", "2023-10-22", (D(2022, 12, 1), D(2023, 1, 1))),
    ("in October", "2023-10-22", (D(2023, 10, 1), D(2023, 11, 1))),
    ("next June", "2023-10-22", (D(2024, 6, 1), D(2024, 7, 1))),
    ("last May", "2023-05-01", (D(2022, 5, 1), D(2022, 6, 1))),
    ("on June 3rd", "2023-05-01", (D(2022, 6, 3), D(2022, 6, 4))),
    ("on March 3", "2023-05-01", (D(2023, 3, 3), D(2023, 3, 4))),
    # relative
    ("yesterday", "2023-05-08", (D(2023, 5, 7), D(2023, 5, 8))),
    ("last night", "2023-05-08", (D(2023, 5, 7), D(2023, 5, 8))),
    ("today", "2023-05-08", (D(2023, 5, 8), D(2023, 5, 9))),
    ("tomorrow", "2023-05-08", (D(2023, 5, 9), D(2023, 5, 10))),
    ("the day before yesterday", "2023-05-08", (D(2023, 5, 6), D(2023, 5, 7))),
    ("last week", "2023-05-10", (D(2023, 5, 1), D(2023, 5, 8))),      # Wed -> Mon..Mon of the week before
    ("this week", "2023-05-10", (D(2023, 5, 8), D(2023, 5, 15))),
    ("next week", "2023-05-10", (D(2023, 5, 15), D(2023, 5, 22))),
    ("last weekend", "2023-05-10", (D(2023, 5, 6), D(2023, 5, 8))),
    ("last weekend", "2023-05-06", (D(2023, 4, 29), D(2023, 5, 1))),   # said on a Saturday
    ("this weekend", "2023-05-10", (D(2023, 5, 13), D(2023, 5, 15))),
    ("last month", "2023-05-10", (D(2023, 4, 1), D(2023, 5, 1))),
    ("last year", "2023-05-10", (D(2022, 1, 1), D(2023, 1, 1))),
    ("this year", "2023-05-10", (D(2023, 1, 1), D(2024, 1, 1))),
    ("3 days ago", "2023-05-10", (D(2023, 5, 7), D(2023, 5, 8))),
    ("two days ago", "2023-05-10", (D(2023, 5, 8), D(2023, 5, 9))),
    ("last Friday", "2023-05-10", (D(2023, 5, 5), D(2023, 5, 6))),
    ("on Friday", "2023-05-12", (D(2023, 5, 5), D(2023, 5, 6))),      # a Friday: the one before
    ("next Friday", "2023-05-10", (D(2023, 5, 12), D(2023, 5, 13))),
    ("last summer", "2023-10-22", (D(2023, 6, 1), D(2023, 9, 1))),
    ("last summer", "2023-07-10", (D(2022, 6, 1), D(2022, 9, 1))),     # in summer: the one before
    ("during the summer", "2023-10-22", (D(2023, 6, 1), D(2023, 9, 1))),
    ("earlier this year", "2023-05-10", (D(2023, 1, 1), D(2023, 5, 10))),
    ("since 2016", "2023-05-10", (D(2016, 1, 1), D(2023, 5, 10))),
    ("before 2020", "2023-05-10", (None, D(2020, 1, 1))),
    ("after June 2022", "2023-05-10", (D(2022, 7, 1), None)),
    ("between May and June 2023", "2023-10-22", (D(2023, 5, 1), D(2023, 7, 1))),
    # anchored on a date
    ("the week before 9 June 2023", "2023-10-22", (D(2023, 6, 2), D(2023, 6, 9))),
    ("the week before August 3, 2023", "2023-10-22", (D(2023, 7, 27), D(2023, 8, 3))),
    ("The Friday before 15 July 2023", "2023-10-22", (D(2023, 7, 14), D(2023, 7, 15))),
    ("the sunday before 25 May 2023", "2023-10-22", (D(2023, 5, 21), D(2023, 5, 22))),
    ("the day after 3 May 2023", "2023-10-22", (D(2023, 5, 4), D(2023, 5, 5))),
    ("two days before May 10, 2023", "2023-10-22", (D(2023, 5, 8), D(2023, 5, 9))),
    ("last weekend before April 10, 2023", "2023-10-22", (D(2023, 4, 2), D(2023, 4, 10))),
]


@pytest.mark.parametrize("text,now,want", CASES, ids=[f"{c[0]}@{c[1]}" for c in CASES])
def test_parse_ranges(text, now, want):
    assert rng(text, now) == want


@pytest.mark.parametrize("text", ["What did Caroline adopt?", "How long ago was her 18th birthday?",
                                  "He got 2000 people to sign", "May I ask what she said?", "I march on",
                                  "in her 30s", "2023-13-45", "on 31 Juno", ""])
def test_no_range(text):
    q = parse_time(text, "2023-05-10")
    assert not q.has_range and q.start is None and q.end is None
    assert np.all(q.prior([1.0, 2.0]) == 1.0)


def test_month_and_year_boundaries_and_leap_years():
    assert rng("yesterday", "2024-03-01") == (D(2024, 2, 29), D(2024, 3, 1))
    assert rng("yesterday", "2023-03-01") == (D(2023, 2, 28), D(2023, 3, 1))
    assert rng("yesterday", "2024-01-01") == (D(2023, 12, 31), D(2024, 1, 1))
    assert rng("last month", "2024-01-15") == (D(2023, 12, 1), D(2024, 1, 1))
    assert rng("next month", "2023-12-31") == (D(2024, 1, 1), D(2024, 2, 1))
    assert rng("last week", "2024-01-03") == (D(2023, 12, 25), D(2024, 1, 1))
    assert rng("next year", "2023-12-31") == (D(2024, 1, 1), D(2025, 1, 1))
    assert rng("on Feb 29", "2024-05-01") == (D(2024, 2, 29), D(2024, 3, 1))
    assert rng("on Feb 29", "2023-05-01") == (None, None)  # no Feb 29 in 2023 (and 2022): not a date
    assert rng("on 29 February 2020", "2023-05-01") == (D(2020, 2, 29), D(2020, 3, 1))
    assert rng("the day after 28 February 2024", "2024-05-01") == (D(2024, 2, 29), D(2024, 3, 1))
    assert rng("last Christmas", "2023-01-01") == (D(2022, 12, 24), D(2022, 12, 27))
    assert rng("in December", "2024-01-02") == (D(2023, 12, 1), D(2024, 1, 1))


def test_timezones_and_offsets():
    # 23:30 UTC on 2023-05-07 is already 2023-05-08 in Berlin (UTC+2 in May)
    now = ts(2023, 5, 7, 23) + 1800
    assert rng("yesterday", now) == (D(2023, 5, 6), D(2023, 5, 7))
    q = parse_time("yesterday", now, tz="+02:00")
    assert q.start == ts(2023, 5, 7, tz=dt.timezone(dt.timedelta(hours=2)))
    assert q.end - q.start == DAY
    assert parse_time("yesterday", now, tz="UTC+2").start == q.start
    assert parse_time("yesterday", now, tz=dt.timezone(dt.timedelta(hours=2))).start == q.start
    assert parse_time("yesterday", now, tz="-0530").start == ts(2023, 5, 6, tz=dt.timezone(-dt.timedelta(hours=5, minutes=30)))
    # an ISO offset on now is honoured (its instant), days counted in tz
    q2 = parse_time("today", "2023-05-08T01:00:00+02:00")
    assert dt.datetime.fromtimestamp(q2.start, UTC).date() == D(2023, 5, 7)
    try:
        from zoneinfo import ZoneInfo

        z = ZoneInfo("Europe/Berlin")
    except Exception:  # no zone database on this machine
        z = None
    if z is not None:
        assert parse_time("yesterday", now, tz="Europe/Berlin").start == q.start
        # across the DST change (2023-03-26 in Berlin): a day of 23 hours
        q3 = parse_time("yesterday", ts(2023, 3, 27, 12), tz="Europe/Berlin")
        assert q3.end - q3.start == 23 * 3600


def test_now_handling():
    a = parse_time("last week", "2023-05-10")
    for now in (ts(2023, 5, 10), dt.datetime(2023, 5, 10), dt.date(2023, 5, 10), "10 May 2023",
                "12:00 am on 10 May, 2023", "2023-05-10T00:00:00Z"):
        assert parse_time("last week", now).start == a.start, now
    t0 = time.time()
    q = parse_time("today", None)  # the wall clock
    assert q.start <= t0 + 1 and q.end > t0 - 1 and abs(resolve_now(None) - time.time()) < 5
    assert parse_time("when?", 0).now == 0.0


@pytest.mark.parametrize("now,err", [("not a date", MemkernValueError), (float("nan"), MemkernValueError),
                                     (1e13, MemkernValueError), ([2023], MemkernTypeError), (True, MemkernTypeError)])
def test_bad_now(now, err):
    with pytest.raises(err, match="now"):
        parse_time("last week", now)


def test_bad_text_and_tz():
    with pytest.raises(MemkernTypeError, match="text"):
        parse_time(None, 0)
    with pytest.raises(MemkernTypeError, match="text"):
        parse_time(b"last week", 0)
    for tz in ("+25:00", "Mars/Olympus", "x"):
        with pytest.raises(MemkernValueError, match="tz"):
            parse_time("today", 0, tz=tz)
    with pytest.raises(MemkernTypeError, match="tz"):
        parse_time("today", 0, tz=2)


def test_order_intent_and_anchor():
    assert parse_time("What did Melanie paint recently?", 0).order == "latest"
    assert parse_time("When was the first time she went?", 0).order == "earliest"
    assert parse_time("What did she paint in May 2023?", "2023-10-01").order is None  # a range wins
    for q in ("When did Caroline go to the LGBTQ support group?", "How long ago did he move?",
              "What year did they marry?", "Since when has she painted?", "How many weeks passed between A and B?"):
        assert parse_time(q, 0).intent, q
    for q in ("What did Caroline adopt?", "Where was she when it rained?", "Who came when she called?"):
        assert not parse_time(q, 0).intent, q
    q = parse_time("What did we do the week after my birthday?", "2023-10-01")
    assert q.anchor == "my birthday" and not q.has_range and q.anchor_offset == (DAY, 8 * DAY)
    r = q.resolve(ts(2023, 5, 8))
    assert (r.start, r.end) == (ts(2023, 5, 9), ts(2023, 5, 16)) and r.spans[-1].kind == "anchored"
    q = parse_time("two days before the charity race", 0)
    assert q.anchor == "the charity race" and q.resolve(ts(2023, 5, 8)).start == ts(2023, 5, 6)
    q = parse_time("What did Melanie realize after the charity race?", 0)
    assert q.anchor == "the charity race" and q.anchor_offset[0] == 0.0
    assert parse_time("What happened after that?", 0).anchor is None  # a pronoun is no anchor
    assert parse_time("last week", 0).resolve(5.0).start == parse_time("last week", 0).start  # no anchor: unchanged
    with pytest.raises(MemkernValueError, match="anchor_time"):
        q.resolve(float("nan"))


def test_prior_window_width_lag():
    q = parse_time("in May 2023", "2023-10-01")
    t = np.array([ts(2023, 5, 15), ts(2023, 6, 1), ts(2023, 6, 8), ts(2023, 4, 24), np.nan])
    p = q.prior(t, width=7 * DAY, lag=0)
    assert p.dtype == np.float32 and p.shape == (5,)
    np.testing.assert_allclose(p, [1.0, 1.0, 0.5, 0.5, 0.0], rtol=1e-6)  # end is exclusive: distance 0 at it
    np.testing.assert_allclose(q.prior(t, width=7 * DAY, lag=7 * DAY)[:3], [1.0, 1.0, 1.0], rtol=1e-6)
    open_q = parse_time("before 2020", "2023-10-01")
    assert open_q.prior([ts(1990, 1, 1)])[0] == 1.0 and open_q.prior([ts(2020, 1, 8)], width=7 * DAY, lag=0)[0] == 0.5
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(MemkernValueError, match="width"):
            q.prior(t, width=bad)
    with pytest.raises(MemkernValueError, match="lag"):
        q.prior(t, lag=-1)
    assert q.search_kwargs(lag=DAY) == {"time_range": (q.start, q.end + DAY), "time_field": "event"}
    assert parse_time("nothing", 0).search_kwargs() == {}


def test_time_prior_scores_and_rescore():
    q = parse_time("Who did Maria have dinner with on May 3, 2023?", "2023-08-01")
    et = np.array([ts(2023, 5, 5), ts(2023, 7, 1), ts(2023, 1, 1)])
    mt = np.array([[ts(2023, 5, 3), ts(2023, 5, 4)], [np.nan, np.nan], [np.nan, np.nan]])
    a = time_prior_scores(q, et, weight=1.0, width=7 * DAY, lag=0)
    b = time_prior_scores(q, et, mt, weight=1.0, width=7 * DAY, lag=0)
    assert a[0] == pytest.approx(2 ** (-1 / 7)) and b[0] == 1.0  # the mention is in the range
    assert b[1] == pytest.approx(2 ** (-58 / 7)) and b[2] == pytest.approx(2 ** (-122 / 7))
    intent = parse_time("When did Maria have dinner with her mom?", "2023-08-01")
    got = time_prior_scores(intent, et, mt, intent_weight=0.3)
    np.testing.assert_allclose(got, [0.3, 0.0, 0.0])
    assert time_prior_scores(intent, et) is None  # no mentions known: no intent term
    assert time_prior_scores(parse_time("What did Maria adopt?", 0), et, mt) is None
    s = rescore(np.array([2.0, 1.0, 0.0]), b)  # spread 2: the term is scaled by it
    assert s.dtype == np.float32 and np.argmax(s) == 0 and s[0] == pytest.approx(4.0)
    assert np.array_equal(rescore([1.0, 0.0], None), np.array([1.0, 0.0], np.float32))
    with pytest.raises(MemkernValueError, match="mentions"):
        time_prior_scores(q, et, mt[:2])
    with pytest.raises(MemkernValueError, match="weight"):
        time_prior_scores(q, et, weight=-1)
    with pytest.raises(MemkernValueError, match="intent_weight"):
        time_prior_scores(q, et, intent_weight=float("nan"))


def test_mentioned_time():
    said = "3:18 pm on 4 May, 2023"
    got = mentioned_time("My mom and I made some dinner together last night!", said)
    assert got == [ts(2023, 5, 3), ts(2023, 5, 4)]
    assert mentioned_time("We went to a convention together last month.", "7:34 pm on 18 April, 2023") == \
        [ts(2023, 3, 1), ts(2023, 4, 1)]
    assert mentioned_time("I love painting sunsets.", said) is None
    assert mentioned_time("I've lived here since 2016", said)[0] == ts(2016, 1, 1)


def test_parse_is_fast():
    qs = [c[0] for c in CASES] * 5
    t0 = time.perf_counter()
    for q in qs:
        parse_time(q, 1.7e9)
    per = (time.perf_counter() - t0) / len(qs)
    assert per < 1e-3, f"{per * 1e6:.0f} us per question"
