"""MemReread loop: every branch with a scripted fake backend, batching/scheduling, chunking with
the real tokenizer, and one integration run with the real SmolLM2."""
from __future__ import annotations

import pytest

import memkern
from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.loops.memreread.loop import MemReread, Result, normalize_question
from memkern.loops.memreread import prompts as P

from fakes_memreread import DOC, FakeChat


def mr(fake, **kw):
    kw.setdefault("chunk_tokens", 14)
    kw.setdefault("memory_tokens", 60)
    return MemReread(fake, **kw)


def test_sufficient_at_once():
    fake = FakeChat()
    r = mr(fake).answer(DOC, "What is the Zorblat code?")
    assert isinstance(r, Result) and memkern.MemReread is MemReread
    assert r.stop_reason == "enough" and r.rereads == 0 and r.sub_questions == []
    assert r.calls == {"read": r.n_chunks, "decompose": 1, "answer": 1}
    assert r.n_chunks == 3 and r.doc_tokens == len(DOC.split())
    assert r.answer == "The Zorblat code is 4417."
    assert [t.role for t in r.trace] == ["read"] * 3 + ["decompose", "answer"]


def test_reread_integrate_loop_until_cap():
    fake = FakeChat(decompose=lambda q, notes, asked, n: {"enough": False,
                                                          "sub_question": f"Where does the Quix river flow {n}?"})
    r = mr(fake, max_rereads=2).answer(DOC, "What is the Zorblat code?")
    assert r.stop_reason == "max_rereads" and r.rereads == 2
    n = r.n_chunks
    assert r.calls == {"read": n, "decompose": 2, "reread": 2 * n, "sub_answer": 2, "integrate": 2, "answer": 1}
    # child passes read the document for the sub-question, with a fresh memory
    assert [q for q, _ in r.sub_questions] == ["Where does the Quix river flow 1?", "Where does the Quix river flow 2?"]
    assert all(a == "The Quix river flows north." for _, a in r.sub_questions)
    # integration put the sub-answer into the root memory
    assert "The Quix river flows north." in r.memory and "Zorblat code is 4417" in r.memory
    order = [t.role for t in r.trace]
    assert order[:n + 1] == ["read"] * n + ["decompose"]
    assert order[n + 1:2 * n + 3] == ["reread"] * n + ["sub_answer", "integrate"]


def test_sub_question_history_shown_to_decompose():
    seen = []

    def dec(q, notes, asked, n):
        seen.append(asked)
        return {"enough": n >= 2} if n >= 2 else {"enough": False, "sub_question": "Where does the Quix river flow?"}

    r = mr(FakeChat(decompose=dec), max_rereads=3).answer(DOC, "What is the Zorblat code?")
    assert r.stop_reason == "enough" and r.rereads == 1
    assert seen[0] == "(none)"
    assert "Where does the Quix river flow? -> The Quix river flows north." in seen[1]


def test_repeated_sub_question_refused():
    # the model keeps re-asking the main question (reworded trivially): refused, re-asked once, stop
    fake = FakeChat(decompose=lambda q, notes, asked, n: {"enough": False, "sub_question": "what is the zorblat code"})
    r = mr(fake, max_rereads=3, repeat_retries=1).answer(DOC, "What is the Zorblat code?")
    assert r.stop_reason == "repeat" and r.rereads == 0
    assert r.refused == ["what is the zorblat code"] * 2
    assert r.calls == {"read": r.n_chunks, "decompose": 2, "answer": 1}


def test_repeat_of_earlier_sub_question_refused_after_one_reread():
    asks = ["Where does the Quix river flow?", "Where does the Quix river flow ?",
            "Where, exactly, does the Quix river flow?", "Which way does the Quix river flow north?"]
    fake = FakeChat(decompose=lambda q, notes, asked, n: {"enough": False, "sub_question": asks[min(n - 1, 3)]})
    r = mr(fake, max_rereads=3, repeat_retries=2, repeat_threshold=0.8).answer(DOC, "What is the Zorblat code?")
    # ask 1 accepted; ask 2 (same normalised text) refused; ask 3 (Jaccard 6/7) refused;
    # ask 4 (Jaccard 5/9 < 0.8) accepted as new
    assert [q for q, _ in r.sub_questions][:2] == [asks[0], asks[3]]
    assert r.refused[:2] == [asks[1], asks[2]]
    assert normalize_question(asks[1]) == normalize_question(asks[0])


def test_unparsed_decompose_stops():
    fake = FakeChat(decompose=lambda q, notes, asked, n: "I think we should look further.")
    r = mr(fake, max_rereads=3).answer(DOC, "What is the Zorblat code?")
    assert r.stop_reason == "unparsed" and r.rereads == 0
    # JSON repair: code fence + single quotes still parse
    assert MemReread.parse_decompose("```json\n{'enough': false, 'sub_question': 'Who is X?'}\n```") == ("ask", "Who is X?")
    assert MemReread.parse_decompose('{"enough": "true"}') == ("enough", None)
    assert MemReread.parse_decompose('{"enough": false}') == ("unparsed", None)


def test_integration_keeps_confirmed_facts():
    def read(user):
        return "The Zorblat code is 4417. [confirmed]\nThe sky was grey."

    fake = FakeChat(read=read,
                    decompose=lambda q, notes, asked, n: {"enough": False, "sub_question": "Who made the Zorblat code?"},
                    integrate=lambda q, notes, sq, sa: "Dr Vell made the Zorblat code.")
    r = mr(fake, max_rereads=1).answer(DOC, "What is the Zorblat code?")
    lines = r.memory.splitlines()
    assert lines == ["Dr Vell made the Zorblat code.", "The Zorblat code is 4417. [confirmed]"]
    # a rewrite that keeps the fact (tag moved/duplicated) is not duplicated
    assert MemReread.keep_confirmed("A fact. [confirmed]", "a fact.  [confirmed]\nB") == "a fact.  [confirmed]\nB"


def test_memory_cap_enforced():
    long_notes = "\n".join([f"note {i} " + "word " * 8 for i in range(40)]
                           + ["The Zorblat code is 4417. [confirmed]"])

    fake = FakeChat(read=lambda user: long_notes)
    m = mr(fake, memory_tokens=30, max_rereads=0)
    r = m.answer(DOC, "What is the Zorblat code?")
    assert fake.count_tokens(r.memory) <= 30
    # untagged lines are dropped from the end first; the tagged line survives
    assert r.memory.splitlines()[-1] == "The Zorblat code is 4417. [confirmed]"
    assert r.memory.startswith("note 0 ")
    # a single over-long line is cut at the cap (character-level fallback, no tokenizer)
    capped = m.cap_memory("x " * 100)
    assert fake.count_tokens(capped) == 30


def test_memory_cap_enforced_after_integrate():
    """Issue 17 item 5: the integrate step's output is capped too. The reads stay small; integrate
    writes far more than memory_tokens; the memory (what the next decompose and the answer see, and
    Result.memory) stays within the cap, with the [confirmed] line kept."""
    huge = "\n".join(f"integrated fact {i} " + "detail " * 6 for i in range(50))
    seen_notes = []

    def dec(q, notes, asked, n):
        seen_notes.append(notes)
        return {"enough": False, "sub_question": f"Where does the Quix river flow {n}?"}

    fake = FakeChat(read=lambda user: "The Zorblat code is 4417. [confirmed]", decompose=dec,
                    integrate=lambda q, notes, sq, sa: huge)
    assert fake.count_tokens(huge) > 300
    m = mr(fake, memory_tokens=40, max_rereads=2)
    r = m.answer(DOC, "What is the Zorblat code?")
    assert r.calls["integrate"] == 2 and len(seen_notes) == 2
    assert fake.count_tokens(r.memory) <= 40
    assert fake.count_tokens(seen_notes[1]) <= 40  # the memory after the first integrate
    assert "integrated fact 0" in r.memory and r.memory.splitlines()[-1] == "The Zorblat code is 4417. [confirmed]"


def test_empty_and_one_chunk_documents():
    fake = FakeChat()
    m = mr(fake, max_rereads=1)
    for doc in ("", "   \n "):
        r = m.answer(doc, "What is the Zorblat code?")
        assert r.n_chunks == 0 and r.doc_tokens == len(doc.split())
        assert r.calls == {"decompose": 1, "answer": 1} and r.answer == "unknown" and r.memory == ""
    r = mr(fake, chunk_tokens=1000).answer(DOC, "What is the Zorblat code?")
    assert r.n_chunks == 1 and r.calls["read"] == 1 and r.answer == "The Zorblat code is 4417."


def test_max_rereads_zero_is_memagent():
    fake = FakeChat(decompose=lambda *a: pytest.fail("MemAgent must not decompose"))
    m = mr(fake, max_rereads=0)
    r = m.answer(DOC, "What is the Zorblat code?")
    assert r.calls == {"read": r.n_chunks, "answer": 1} and r.stop_reason == "max_rereads"
    # hand-written MemAgent: overwrite the memory chunk by chunk, then answer
    chunks = m.chunk(DOC)
    memory = ""
    ref = FakeChat()
    for i, c in enumerate(chunks):
        memory = ref.generate([P.read_messages("What is the Zorblat code?", memory, c, i, len(chunks))])[0]
    answer = ref.generate([P.answer_messages("What is the Zorblat code?", memory)])[0]
    assert (r.memory, r.answer) == (memory, answer)


def test_answer_batch_shares_batches_and_matches_single():
    def dec(q, notes, asked, n):
        if "Quix" in q or "(none)" not in asked:
            return {"enough": True}
        return {"enough": False, "sub_question": "Where does the Quix river flow?"}

    docs = [DOC, DOC * 3, "", DOC + " The Zorblat code was changed to 9."]
    qs = ["What is the Zorblat code?", "Where does the Quix river flow?", "What is the Zorblat code?",
          "What is the Zorblat code?"]
    single = [mr(FakeChat(decompose=dec), max_rereads=2).answer(d, q) for d, q in zip(docs, qs)]
    fake = FakeChat(decompose=dec)
    done = []
    batched = mr(fake, max_rereads=2).answer_batch(docs, qs, progress=False, callback=lambda i, r: done.append((i, r)))
    assert sorted(i for i, _ in done) == [0, 1, 2, 3] and all(batched[i] is r for i, r in done)
    last_step = [r.trace[-1].step for r in batched]
    assert [last_step[i] for i, _ in done] == sorted(last_step)  # reported as soon as finished
    for a, b in zip(single, batched):
        assert (a.answer, a.memory, a.sub_questions, a.calls, a.rereads) == (b.answer, b.memory, b.sub_questions,
                                                                             b.calls, b.rereads)
    n_single = sum(sum(r.calls.values()) for r in single)
    assert sum(len(b) for b in fake.batches) == n_single
    assert len(fake.batches) < n_single / 2
    # items in different phases shared one generate call (root reads with child rereads)
    read_steps = {t.step for t in batched[1].trace if t.role == "read"}
    shared = [t for t in batched[0].trace if t.role == "reread" and t.step in read_steps]
    assert shared and all(t.batch >= 2 for t in shared)
    assert any({"read", "integrate"} <= set(b) for b in fake.batches)  # same length: one group
    # trace: steps increase, batch sizes recorded, time shares non-negative
    for r in batched:
        steps = [t.step for t in r.trace]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
        assert all(t.batch >= 1 and t.seconds >= 0 and t.prompt_tokens > 0 for t in r.trace)


def test_validation():
    fake = FakeChat()
    with pytest.raises(MemkernValueError, match="chunk_tokens"):
        MemReread(fake, chunk_tokens=0)
    with pytest.raises(MemkernValueError, match="max_rereads"):
        MemReread(fake, max_rereads=-1)
    with pytest.raises(MemkernValueError, match="repeat_threshold"):
        MemReread(fake, repeat_threshold=0)
    with pytest.raises(MemkernTypeError, match="chat_model"):
        MemReread(object())
    m = mr(fake)
    with pytest.raises(MemkernValueError, match="questions"):
        m.answer_batch([DOC, DOC], ["q"])
    with pytest.raises(MemkernValueError, match=r"questions\[0\]"):
        m.answer(DOC, "  ")
    with pytest.raises(MemkernTypeError, match="documents"):
        m.answer_batch(DOC, ["q"])
    with pytest.raises(MemkernTypeError, match=r"documents\[1\]"):
        m.answer_batch([DOC, 3], ["q", "q"])


@pytest.fixture(scope="module")
def tiny():
    from memkern.models import tiny_chat_model

    return tiny_chat_model(seed=0, max_new_tokens=16)


def test_chunking_with_real_tokenizer_and_context_check(tiny):
    m = MemReread(tiny, chunk_tokens=50, memory_tokens=32, max_new_tokens=16)
    doc = " ".join(f"Sentence number {i} says the value is {i * 7}." for i in range(60))
    chunks = m.chunk(doc)
    assert "".join(chunks) == doc  # exact slices, nothing lost or duplicated
    assert all(tiny.count_tokens(c) <= 51 for c in chunks)  # re-tokenising a slice may merge a space
    assert len(chunks) == -(-tiny.count_tokens(doc) // 50)
    capped = m.cap_memory(doc)
    assert tiny.count_tokens(capped) <= 32 and doc.startswith(capped)
    with pytest.raises(MemkernValueError, match="chunk_tokens.*context 8192"):
        MemReread(tiny, chunk_tokens=7000, memory_tokens=1024)


@pytest.mark.slow
def test_tiny_model_batched_equals_single(tiny):
    m = MemReread(tiny, chunk_tokens=64, memory_tokens=24, max_new_tokens=12, answer_tokens=8,
                  decompose_tokens=12, max_rereads=1)
    docs = [DOC * 2, DOC, DOC * 4]
    qs = ["What is the Zorblat code?", "Where does the Quix river flow?", "Which code?"]
    batched = m.answer_batch(docs, qs)
    single = [m.answer(d, q) for d, q in zip(docs, qs)]
    assert [r.answer for r in batched] == [r.answer for r in single]
    assert [r.memory for r in batched] == [r.memory for r in single]
    for r in batched:
        assert tiny.count_tokens(r.memory) <= 24
        assert all(t.output_tokens <= 12 for t in r.trace)


@pytest.fixture(scope="module")
def smol():
    from memkern.models import ChatModel

    return ChatModel()


@pytest.mark.slow
def test_real_smollm2_short_document(smol):
    filler = ("The committee met on a rainy afternoon to discuss the budget for the new library. "
              "Several members argued about the size of the reading room and the cost of chairs. ")
    needle = "The secret password for the library vault is Blue Falcon. "
    doc = filler * 6 + needle + filler * 6
    m = MemReread(smol, chunk_tokens=160, memory_tokens=48, max_new_tokens=32, answer_tokens=12,
                  decompose_tokens=32, max_rereads=1)
    res = m.answer_batch([doc, doc[: len(doc) // 2]], ["What is the secret password for the library vault?",
                                                       "What did the committee discuss?"])
    for r in res:
        assert r.n_chunks >= 2 and r.calls["read"] == r.n_chunks
        assert smol.count_tokens(r.memory) <= 48
        assert isinstance(r.answer, str) and r.answer
        assert r.stop_reason in ("enough", "max_rereads", "repeat", "unparsed")
        assert r.rereads <= 1 and r.calls.get("reread", 0) == r.rereads * r.n_chunks
        assert all(t.output_tokens <= 32 and t.prompt_tokens > 0 for t in r.trace)
