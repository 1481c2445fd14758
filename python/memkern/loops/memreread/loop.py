"""MemReread: question answering over documents far longer than the model's context.

The loop, per (document, question):

1. **Read** -- the document is tokenized with the chat model's tokenizer and cut into chunks of
   ``chunk_tokens``; starting from an empty memory, the model rewrites the memory after each chunk
   (question + previous memory + chunk -> new memory). The memory is capped at ``memory_tokens``
   by the code (lines not tagged ``[confirmed]`` are dropped from the end first, then the text is
   cut at the token cap), whatever the model writes.
2. **Decompose** -- given question, memory and the earlier (sub-question, answer) pairs, the model
   says the memory is enough, or asks ONE sub-question (JSON). A sub-question that repeats the
   question or an earlier/refused sub-question (same normalised text, or token-set Jaccard
   >= ``repeat_threshold``) is refused by the code; the model is re-asked ``repeat_retries`` times,
   then the loop stops.
3. **Reread** -- a child pass streams the whole document again for the sub-question with a fresh
   memory, then answers the sub-question from that memory.
4. **Integrate** -- the root memory is rewritten from (question, memory, sub-question,
   sub-answer); ``[confirmed]`` lines of the old memory that the rewrite dropped are put back by
   the code. The pair joins the history.
5. **Answer** -- from the root memory, once the memory is enough or ``max_rereads`` rereads are
   spent. ``max_rereads=0`` is exactly MemAgent: read, then answer (no decompose call).

:meth:`MemReread.answer_batch` runs every item as a small state machine (a Python generator that
yields the model call it needs next). A scheduler collects the pending calls of ALL items -- root
reads, child rereads, decompose, integrate, answers -- and sends them to the chat model together,
one ``generate`` call per (json, max_new_tokens) group per step, so items in different phases share
batches. Each item's :class:`Result` carries a trace of every call.
"""
from __future__ import annotations

import logging
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Generator, Sequence

from ...errors import MemkernTypeError, MemkernValueError, bad_arg
from ...base.validate import check_float, check_int
from . import prompts as P
from ...protocols import ChatModel as ChatModelProtocol

log = logging.getLogger("memkern")

ROLES = ("read", "decompose", "reread", "sub_answer", "integrate", "answer")


@dataclass
class Call:
    """One model call an item needs: ``role`` (one of :data:`ROLES`), chat ``messages``,
    generation length and whether JSON is asked for."""

    role: str
    messages: list
    max_new_tokens: int
    json: bool = False


@dataclass
class TraceEntry:
    """One model call of one item.

    ``seconds`` is this call's share of the batched ``generate`` call's wall time, in proportion
    to its prompt + output tokens; ``step`` is the scheduler step; ``batch`` the number of prompts
    that shared the ``generate`` call."""

    role: str
    prompt_tokens: int
    output_tokens: int
    seconds: float
    step: int
    batch: int


@dataclass
class Result:
    """Outcome of one (document, question) item.

    Attributes
    ----------
    answer : final answer text.
    memory : final root memory.
    sub_questions : list of (sub-question, sub-answer) pairs, in order.
    rereads : number of child rereads done.
    calls : ``{role: count}`` of model calls.
    trace : every call, in order (:class:`TraceEntry`).
    refused : sub-questions refused by the code as repeats.
    stop_reason : ``"enough"`` (memory judged sufficient), ``"max_rereads"``, ``"repeat"``
        (only repeats were proposed) or ``"unparsed"`` (the decompose reply was unusable).
    n_chunks, doc_tokens : size of the document as read.
    """

    answer: str = ""
    memory: str = ""
    sub_questions: list = field(default_factory=list)
    rereads: int = 0
    calls: dict = field(default_factory=dict)
    trace: list = field(default_factory=list)
    refused: list = field(default_factory=list)
    stop_reason: str = ""
    n_chunks: int = 0
    doc_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.trace)

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.trace)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.trace)


_WORD = re.compile(r"[a-z0-9]+")


def normalize_question(text: str) -> str:
    """Lower-case alphanumeric words joined by single spaces (for repeat detection)."""
    return " ".join(_WORD.findall(text.lower()))


def _jaccard(a: str, b: str) -> float:
    sa, sb = set(a.split()), set(b.split())
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def _strip_tag(line: str) -> str:
    return " ".join(line.replace(P.CONFIRMED_TAG, " ").split()).lower()


class MemReread:
    """MemReread reader (MemAgent when ``max_rereads=0``).

    Parameters
    ----------
    chat_model : memkern.protocols.ChatModel, optional
        E.g. :class:`memkern.ChatModel`, :class:`memkern.OpenAIChatModel` or any object with
        ``generate(prompts, max_new_tokens=, json=) -> list[str]`` and ``count_tokens(text)``;
        ``None`` -> the offline default (SmolLM2-135M-Instruct). Chunking uses its ``tokenizer``
        when it has one (exact token chunks), else ``count_tokens`` (character chunks sized by the
        document's characters-per-token ratio).
    chunk_tokens : tokens of document per read call.
    memory_tokens : hard cap of the memory (tokens), enforced by the code.
    max_rereads : child rereads allowed per question (0 = MemAgent).
    max_new_tokens : generation length of memory writes (read / integrate); ``None`` ->
        ``memory_tokens``.
    answer_tokens : generation length of answers and sub-answers.
    decompose_tokens : generation length of the decompose JSON.
    repeat_threshold : token-set Jaccard similarity above which a sub-question is a repeat.
    repeat_retries : re-asks of the decompose step after a refused repeat, per round.
    """

    def __init__(self, chat_model: ChatModelProtocol | None = None, chunk_tokens: int = 5000, memory_tokens: int = 1024,
                 max_rereads: int = 3, max_new_tokens: int | None = None, answer_tokens: int = 64,
                 decompose_tokens: int = 96, repeat_threshold: float = 0.8, repeat_retries: int = 1):
        self.chunk_tokens = check_int("chunk_tokens", chunk_tokens, 1)
        self.memory_tokens = check_int("memory_tokens", memory_tokens, 1)
        self.max_rereads = check_int("max_rereads", max_rereads, 0)
        self.max_new_tokens = self.memory_tokens if max_new_tokens is None else check_int(
            "max_new_tokens", max_new_tokens, 1)
        self.answer_tokens = check_int("answer_tokens", answer_tokens, 1)
        self.decompose_tokens = check_int("decompose_tokens", decompose_tokens, 1)
        self.repeat_retries = check_int("repeat_retries", repeat_retries, 0)
        self.repeat_threshold = check_float("repeat_threshold", repeat_threshold, 0, 1, low_open=True)
        if chat_model is None:
            from ...models import ChatModel

            chat_model = ChatModel()
        if not isinstance(chat_model, ChatModelProtocol):
            raise bad_arg("chat_model", "an object with generate() and count_tokens() (memkern.protocols.ChatModel)",
                          type(chat_model).__name__, MemkernTypeError)
        self.chat_model = chat_model
        tok = getattr(chat_model, "tokenizer", None)
        self._tokenizer = tok if callable(tok) else None
        ctx = getattr(chat_model, "context_length", None)
        if isinstance(ctx, int):
            # prompt = instructions (~300 tokens) + question + memory + chunk; plus the reply.
            need = self.chunk_tokens + self.memory_tokens + self.max_new_tokens + 400
            if need > ctx:
                raise bad_arg("chunk_tokens", f"chunk_tokens + memory_tokens + max_new_tokens + 400 <= the "
                              f"model's context {ctx} (memory_tokens={self.memory_tokens}, "
                              f"max_new_tokens={self.max_new_tokens})", self.chunk_tokens)
        log.info("MemReread: chunk_tokens=%d memory_tokens=%d max_rereads=%d (%s)", self.chunk_tokens,
                 self.memory_tokens, self.max_rereads,
                 "MemAgent baseline" if self.max_rereads == 0 else "decompose + reread")

    # ------------------------------------------------------------------ text utilities
    def count_tokens(self, text: str) -> int:
        return int(self.chat_model.count_tokens(text))

    def chunk(self, document: str) -> list[str]:
        """Cut ``document`` into consecutive pieces of at most ``chunk_tokens`` tokens (exact
        character slices of the original text; ``[]`` for an empty or blank document)."""
        if not document.strip():
            return []
        tok = self._tokenizer
        if tok is not None:
            try:
                enc = tok(document, add_special_tokens=False, return_offsets_mapping=True)
                offsets = enc["offset_mapping"]
            except (NotImplementedError, KeyError, TypeError, ValueError):
                offsets = None
            if offsets is not None:
                out, n = [], len(offsets)
                start_char = 0
                for s in range(0, n, self.chunk_tokens):
                    e = min(s + self.chunk_tokens, n)
                    end_char = len(document) if e == n else offsets[e][0]
                    piece = document[start_char:end_char]
                    if piece.strip():
                        out.append(piece)
                    start_char = end_char
                return out
        # No offsets: character chunks sized by the document's chars/token ratio, cut at spaces.
        total = max(1, self.count_tokens(document))
        size = max(1, int(len(document) / total * self.chunk_tokens))
        out, i = [], 0
        while i < len(document):
            j = min(len(document), i + size)
            if j < len(document):
                sp = document.rfind(" ", i + size // 2, j)
                j = sp + 1 if sp > i else j
            if document[i:j].strip():
                out.append(document[i:j])
            i = j
        return out

    def _truncate_tokens(self, text: str, n: int) -> str:
        """Longest prefix of ``text`` with at most ``n`` tokens."""
        if self.count_tokens(text) <= n:
            return text
        tok = self._tokenizer
        cut = None
        if tok is not None:
            try:
                offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
                cut = offsets[n][0] if n < len(offsets) else len(text)
            except (NotImplementedError, KeyError, TypeError, ValueError, IndexError):
                cut = None
        if cut is None:  # binary search on characters
            lo, hi = 0, len(text)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.count_tokens(text[:mid]) <= n:
                    lo = mid
                else:
                    hi = mid - 1
            cut = lo
        out = text[:cut]
        while out and self.count_tokens(out) > n:  # re-tokenised prefixes can differ by a token
            out = out[:-1]
        return out.rstrip()

    def cap_memory(self, memory: str) -> str:
        """Enforce ``memory_tokens``: drop untagged lines from the end first (``[confirmed]``
        lines are kept), then cut the text at the token cap."""
        memory = memory.strip()
        if self.count_tokens(memory) <= self.memory_tokens:
            return memory
        lines = memory.splitlines()
        drop = [i for i in range(len(lines)) if P.CONFIRMED_TAG not in lines[i]]
        keep = set(range(len(lines)))
        while drop and self.count_tokens("\n".join(lines[i] for i in sorted(keep))) > self.memory_tokens:
            keep.discard(drop.pop())
        text = "\n".join(lines[i] for i in sorted(keep)).strip()
        if not text:  # one huge untagged line: keep its head rather than nothing
            text = memory
        return self._truncate_tokens(text, self.memory_tokens)

    @staticmethod
    def keep_confirmed(old: str, new: str) -> str:
        """``new`` plus every ``[confirmed]`` line of ``old`` whose fact ``new`` no longer holds."""
        new_lines = [l for l in new.splitlines() if l.strip()]
        have = {_strip_tag(l) for l in new_lines}
        for line in old.splitlines():
            if P.CONFIRMED_TAG in line and _strip_tag(line) not in have:
                new_lines.append(line.strip())
                have.add(_strip_tag(line))
        return "\n".join(new_lines)

    def is_repeat(self, candidate: str, earlier: Sequence[str]) -> str | None:
        """The earlier question ``candidate`` repeats, or ``None``."""
        c = normalize_question(candidate)
        for q in earlier:
            nq = normalize_question(q)
            if c == nq or _jaccard(c, nq) >= self.repeat_threshold:
                return q
        return None

    @staticmethod
    def parse_decompose(text: str) -> tuple[str, str | None]:
        """``("enough", None)``, ``("ask", sub_question)`` or ``("unparsed", None)``."""
        from ...text.jsonrepair import JSONRepairError, parse_json

        try:
            obj = parse_json(text, expect=dict)
        except JSONRepairError:
            return "unparsed", None
        enough = obj.get("enough", obj.get("sufficient"))
        if isinstance(enough, str):
            enough = enough.strip().lower() in ("true", "yes", "1")
        sub = obj.get("sub_question", obj.get("subquestion", obj.get("question")))
        if enough is True:
            return "enough", None
        if isinstance(sub, str) and sub.strip():
            return "ask", " ".join(sub.split())
        return "unparsed", None

    # ------------------------------------------------------------------ per-item state machine
    def _stream(self, chunks: list[str], question: str, role: str) -> Generator[Call, str, str]:
        memory = ""
        for i, ch in enumerate(chunks):
            out = yield Call(role, P.read_messages(question, memory, ch, i, len(chunks)), self.max_new_tokens)
            out = out.strip()
            if out:
                memory = self.cap_memory(out)
            else:
                log.debug("MemReread: empty %s reply for chunk %d; memory kept", role, i)
        return memory

    def _item(self, chunks: list[str], question: str, res: Result) -> Generator[Call, str, None]:
        memory = yield from self._stream(chunks, question, "read")
        history: list[tuple[str, str]] = []
        stop = "max_rereads"
        while res.rereads < self.max_rereads:
            refused_now: list[str] = []
            sub = None
            verdict = "unparsed"
            for _ in range(1 + self.repeat_retries):
                out = yield Call("decompose", P.decompose_messages(question, memory, history, refused_now),
                                 self.decompose_tokens, json=True)
                verdict, cand = self.parse_decompose(out)
                if verdict != "ask":
                    break
                rep = self.is_repeat(cand, [question] + [q for q, _ in history] + refused_now)
                if rep is None:
                    sub = cand
                    break
                log.debug("MemReread: refused sub-question %r (repeats %r)", cand, rep)
                refused_now.append(cand)
                res.refused.append(cand)
                verdict = "repeat"
            if sub is None:
                stop = verdict
                break
            child = yield from self._stream(chunks, sub, "reread")
            sub_answer = (yield Call("sub_answer", P.answer_messages(sub, child), self.answer_tokens)).strip()
            res.rereads += 1
            new = yield Call("integrate", P.integrate_messages(question, memory, sub, sub_answer),
                             self.max_new_tokens)
            new = new.strip()
            if new:
                memory = self.cap_memory(self.keep_confirmed(memory, new))
            history.append((sub, sub_answer))
        res.stop_reason = stop
        res.sub_questions = history
        res.memory = memory
        res.answer = (yield Call("answer", P.answer_messages(question, memory), self.answer_tokens)).strip()

    # ------------------------------------------------------------------ public API
    def answer(self, document: str, question: str) -> Result:
        """Answer one question over one document (see :meth:`answer_batch`)."""
        return self.answer_batch([document], [question])[0]

    def answer_batch(self, documents: Sequence[str], questions: Sequence[str], progress: bool = False,
                     callback: Callable[[int, Result], None] | None = None) -> list[Result]:
        """Answer many (document, question) items, batching their model calls.

        Parameters
        ----------
        documents : list of str, length ``n``.
        questions : list of str, length ``n`` (non-empty).
        progress : show a progress bar over finished items.
        callback : called as ``callback(index, result)`` as soon as item ``index`` is finished.

        Returns
        -------
        list of :class:`Result`, in input order.
        """
        for name, seq in (("documents", documents), ("questions", questions)):
            if isinstance(seq, str) or not isinstance(seq, (list, tuple)):
                raise bad_arg(name, "a list of str", type(seq).__name__, MemkernTypeError)
            for i, s in enumerate(seq):
                if not isinstance(s, str):
                    raise bad_arg(f"{name}[{i}]", "str", type(s).__name__, MemkernTypeError)
        if len(documents) != len(questions):
            raise bad_arg("questions", f"{len(documents)} questions (one per document)", len(questions))
        for i, q in enumerate(questions):
            if not q.strip():
                raise bad_arg(f"questions[{i}]", "a non-empty question", q)
        results = [Result() for _ in documents]
        active: list[tuple[int, Generator, Call]] = []
        for i, (doc, q) in enumerate(zip(documents, questions)):
            chunks = self.chunk(doc)
            results[i].n_chunks = len(chunks)
            results[i].doc_tokens = self.count_tokens(doc) if doc else 0
            gen = self._item(chunks, q.strip(), results[i])
            active.append((i, gen, next(gen)))
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(results), desc="MemReread", unit="item")
        step = 0
        try:
            while active:
                groups: dict[tuple[bool, int], list[int]] = defaultdict(list)
                for k, (_, _, call) in enumerate(active):
                    groups[(call.json, call.max_new_tokens)].append(k)
                replies: dict[int, str] = {}
                for (js, mnt), ks in groups.items():
                    calls = [active[k][2] for k in ks]
                    t0 = time.perf_counter()
                    outs = self.chat_model.generate([c.messages for c in calls], max_new_tokens=mnt, json=js)
                    dt = time.perf_counter() - t0
                    if not isinstance(outs, list) or len(outs) != len(calls):
                        raise MemkernValueError(f"chat_model.generate: expected {len(calls)} replies, got "
                                                f"{len(outs) if isinstance(outs, list) else type(outs).__name__}")
                    usage = getattr(self.chat_model, "last_usage", None)
                    if not (isinstance(usage, list) and len(usage) == len(calls)):
                        usage = [(sum(self.count_tokens(m["content"]) for m in c.messages), self.count_tokens(o))
                                 for c, o in zip(calls, outs)]
                    weight = sum(p + o for p, o in usage) or 1
                    for k, c, o, (p, n) in zip(ks, calls, outs, usage):
                        replies[k] = o
                        results[active[k][0]].trace.append(
                            TraceEntry(c.role, int(p), int(n), dt * (p + n) / weight, step, len(calls)))
                still = []
                for k, (i, gen, _call) in enumerate(active):
                    try:
                        still.append((i, gen, gen.send(replies[k])))
                    except StopIteration:
                        results[i].calls = dict(Counter(t.role for t in results[i].trace))
                        if bar is not None:
                            bar.update(1)
                        if callback is not None:
                            callback(i, results[i])
                active = still
                step += 1
        finally:
            if bar is not None:
                bar.close()
        return results

    def __repr__(self) -> str:
        return (f"MemReread(chunk_tokens={self.chunk_tokens}, memory_tokens={self.memory_tokens}, "
                f"max_rereads={self.max_rereads})")


__all__ = ["Call", "MemReread", "Result", "TraceEntry", "ROLES", "normalize_question"]
