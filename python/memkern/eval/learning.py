"""Learning through :meth:`memkern.RMM.respond`: what the reranker gains, what the user is shown.

Per conversation a bank is written through :meth:`memkern.RMM.end_session` (the default
two-level memory). Each *split* draws half of the conversation's questions (those with evidence
turns, adversarial ones left out: LoCoMo categories 1-4) for training and keeps the other half
held out. Every *arm*
starts a fresh reranker, asks the training questions once, in a seeded order, through
``RMM.respond`` with :class:`CitingChat` (a chat-model fake that cites a shown memory when its
prompt block holds an evidence turn of the question: the simulation rule), and then reads the
held-out questions with ``RMM.retrieve(q, turns=N)``:

- ``heldout R@N before / after``: evidence recall of the best ``N`` turns (the reranker's greedy
  read: each turn's first-stage score plus its memory's learned residual) on the held-out
  questions, for a fresh reranker and after the training pass;
- ``shown`` / ``greedy``: during the training pass, evidence recall of the turns ``respond``
  showed the model, and of those the reranker's best memories would have shown at that moment
  (``RMM.retrieve`` just before the call): what the user paid for exploration.

Arms (:data:`ARMS`):

- ``greedy``: the default, ``RMMConfig.explore=0``: every call shows the reranker's best
  memories and the reranker learns from their citations (:mod:`memkern.loops.rmm.feedback`);
- ``explore=E``: a share ``E`` of the calls shows a Gumbel-top-M draw (``RMMConfig.explore``);
  ``explore=1`` is the paper's way (every call samples): the reranker fed its own draws on the
  same candidates;
- ``hidden``: the best memories are shown; a hidden Gumbel-top-M draw is what the reranker
  learns from, its slots scored by the citations of the shown memories (slots not shown carry no
  reward: the model can only cite what it saw) (:class:`HiddenSampleReranker`);
- ``swap-last``: on a share of the calls (0.3) the last shown memory is swapped for one drawn
  from the rest by the reranker's softmax (:class:`SwapLastReranker`);
- ``direct``: :class:`memkern.Reranker` fed directly, outside RMM, as the ``reflection``
  experiment does: the frozen retriever's top-K turns (:func:`memkern.eval.online.build_candidates`),
  sampled draws, the same citation rule (a shown evidence turn is cited), the same split and
  batch size; its R@N is the recall of its top ``N`` turns.

``pool=False`` (default): one reranker per conversation (one user, one namespace). ``pool=True``:
one reranker shared by every conversation's RMM, trained on the interleaved stream of all
training questions. Intervals are a per-question bootstrap (questions resampled with
replacement, a question's rows in every split kept together), 95 %, 2000 resamples.
"""
from __future__ import annotations

import dataclasses
import json as _json
import math
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from ..data.schema import Conversation, Dataset, Question
from ..errors import bad_arg
from .data import dataset_info, mean
from .report import ExperimentResult, environment
from .tasks import Experiment, Task, TaskOutput, sum_timings

__all__ = ["ARMS", "CitingChat", "HiddenSampleReranker", "SwapLastReranker", "LearningExperiment",
           "LearningResult", "run_learning", "learning_experiment", "evidence_keys", "bootstrap_ci", "ADVERSARIAL"]

#: The arms, in table order (module doc).
ARMS = ("greedy", "explore=0.05", "explore=1", "hidden", "swap-last", "direct")
BUDGETS = (5, 10)
#: Question types left out unless ``categories`` names them: adversarial questions (LoCoMo's
#: category 5) ask about what was never said.
ADVERSARIAL = ("category_5", "adversarial")
_BLOCK = re.compile(r"^\[(\d+)\] ")


# ------------------------------------------------------------------------------------ the citing fake
def evidence_keys(conv: Conversation, question: Question) -> list[str]:
    """What a prompt shows of each evidence turn of ``question``: ``"{speaker}: {content[:40]}"``
    (whitespace collapsed), the text :class:`CitingChat` looks for in a memory's prompt block."""
    turns = conv.turn_map()
    out = []
    for t in question.evidence_turn_ids:
        turn = turns.get(t)
        if turn is not None:
            content = " ".join(str(turn.content).split())
            out.append(f"{turn.speaker or turn.role}: {content[:40]}")
    return out


class CitingChat:
    """A chat-model fake for :meth:`memkern.RMM.respond` that cites by the simulation rule: a shown
    memory is cited when its block in the prompt (its summary and shown turns) holds the text of an
    evidence turn of the question (:func:`evidence_keys`); nothing else is cited.

    Parameters
    ----------
    keys : dict[str, list[str]]
        Question text -> evidence keys. A question the fake does not know cites nothing.
    """

    def __init__(self, keys: dict[str, list[str]]):
        self.keys = {str(k): list(v) for k, v in keys.items()}
        self.calls = 0

    @staticmethod
    def blocks(prompt: str) -> tuple[list[str], str]:
        """``(memory blocks [i] in order, question)`` of an RMM answer prompt."""
        mem, _, rest = prompt.partition("Memories:\n")[2].partition("\n\n")
        question = prompt.rsplit("Question: ", 1)[-1].strip()
        blocks: list[str] = []
        for line in mem.splitlines():
            if _BLOCK.match(line):
                blocks.append(_BLOCK.sub("", line, count=1))
            elif blocks:
                blocks[-1] += " " + line.strip()
        return [" ".join(b.split()) for b in blocks], question

    def generate(self, prompts: Sequence[Any], max_new_tokens: int | None = None, json: Any = False,
                 temperature: float = 0.0, seed: int | None = None) -> list[str]:
        out = []
        for p in prompts:
            text = p[-1]["content"] if isinstance(p, list) else str(p)
            blocks, question = self.blocks(text)
            keys = self.keys.get(question, [])
            cites = [i for i, b in enumerate(blocks) if any(k in b for k in keys)]
            self.calls += 1
            out.append(_json.dumps({"answer": "from the memories" if cites else "unknown", "citations": cites}))
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())


# ------------------------------------------------------------------------------------ alternative learners
class _Proxy:
    """A stand-in reranker for RMM that delegates to ``rr`` (a :class:`memkern.Reranker`)."""

    def __init__(self, rr: Any):
        self.rr = rr

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["rr"], name)

    def save(self, path: Any) -> None:
        self.rr.save(path)


def _hidden_selection_type():
    from ..score.reranker import Selection

    @dataclass
    class HiddenSelection(Selection):
        hidden: Any = None        # int64 [B, M]: the hidden draw's candidate positions

    return HiddenSelection


class HiddenSampleReranker(_Proxy):
    """Shows the reranker's best memories; learns from a hidden Gumbel-top-M draw whose slots are
    scored by the citations of the shown memories: a drawn candidate that was shown gets its reward,
    one that was not shown is dropped (index ``-1``: no reward, the model never saw it)."""

    def select(self, q, candidates, mask=None, seed=None, greedy=False, m=None, offset=None, prior=None):
        best = self.rr.select(q, candidates, mask=mask, greedy=True, m=m, prior=prior)
        draw = self.rr.select(q, candidates, mask=mask, m=m, prior=prior)       # the reranker's own stream
        fields = {f.name: getattr(best, f.name) for f in dataclasses.fields(best)}
        return _hidden_selection_type()(**fields, hidden=draw.indices)

    def update(self, selection, rewards):
        import torch

        shown, hidden = selection.indices, selection.hidden
        R = torch.as_tensor(rewards, dtype=torch.float32)
        if shown.dim() == 1:
            shown, hidden, R = shown.unsqueeze(0), hidden.unsqueeze(0), R.unsqueeze(0)
        eq = (hidden.unsqueeze(2) == shown.unsqueeze(1)) & (shown.unsqueeze(1) >= 0)     # [B, M, M]
        seen = eq.any(2) & (hidden >= 0)
        Rh = torch.where(seen, (eq.float() * R.unsqueeze(1)).sum(2), torch.zeros(()))
        idx = torch.where(seen, hidden, torch.full_like(hidden, -1))
        if not bool(seen.any()):
            return None
        fields = {f.name: getattr(selection, f.name) for f in dataclasses.fields(selection) if f.name != "hidden"}
        from ..score.reranker import Selection

        sel = Selection(**fields)
        sel.indices = idx if selection.indices.dim() == 2 else idx[0]
        return self.rr.update(sel, Rh if selection.indices.dim() == 2 else Rh[0])


class SwapLastReranker(_Proxy):
    """Shows the reranker's best memories, except on a share ``share`` of the calls (seeded coin),
    where the last one is swapped for a candidate drawn from the others by ``softmax(score / tau)``;
    the reranker learns from what was shown (an explored call has ``greedy=False``)."""

    def __init__(self, rr: Any, share: float = 0.3, seed: int = 0):
        super().__init__(rr)
        self.share = float(share)
        self.rng = np.random.default_rng(seed)

    def select(self, q, candidates, mask=None, seed=None, greedy=False, m=None, offset=None, prior=None):
        import torch

        best = self.rr.select(q, candidates, mask=mask, greedy=True, m=m, prior=prior)
        idx = best.indices if best.indices.dim() == 2 else best.indices.unsqueeze(0)
        sc = best.scores if best.scores.dim() == 2 else best.scores.unsqueeze(0)
        new = idx.clone()
        swapped = False
        for b in range(idx.shape[0]):
            if self.rng.random() >= self.share:
                continue
            s = sc[b].double().clone()
            s[idx[b][idx[b] >= 0]] = -math.inf
            if not bool(torch.isfinite(s).any()):
                continue
            p = torch.softmax(s / self.rr.tau, 0).numpy()
            new[b, -1] = int(self.rng.choice(len(p), p=p / p.sum()))
            swapped = True
        if not swapped:
            return best
        return dataclasses.replace(best, indices=new if best.indices.dim() == 2 else new[0], greedy=False)


# ------------------------------------------------------------------------------------ intervals
def bootstrap_ci(values: np.ndarray, groups: np.ndarray, n: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of ``values`` with a bootstrap interval that resamples ``groups``
    (question ids) with replacement, each group's values kept together."""
    values = np.asarray(values, np.float64)
    groups = np.asarray(groups)
    if values.size == 0:
        return math.nan, math.nan, math.nan
    uniq, inv = np.unique(groups, return_inverse=True)
    sums = np.bincount(inv, weights=values, minlength=len(uniq))
    counts = np.bincount(inv, minlength=len(uniq)).astype(np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(uniq), size=(n, len(uniq)))
    means = sums[pick].sum(1) / counts[pick].sum(1)
    a = (1.0 - level) / 2.0
    return float(values.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1.0 - a))


# ------------------------------------------------------------------------------------ the runs
@dataclass
class LearningResult(ExperimentResult):
    """Result of :func:`run_learning`.

    ``metrics[arm]``: ``heldout`` (per budget ``N``: ``before``, ``after``, ``delta`` with its
    interval ``delta_lo`` / ``delta_hi``, ``questions``), ``shown`` and ``greedy`` (recall during the
    training pass), ``shown_minus_greedy`` with its interval, ``explored`` (share of calls),
    ``calls``, ``updates``, ``by_conversation`` (held-out R@5 delta per conversation); the
    ``heldout`` views are the budgets and ``"respond"`` (the memories respond would show). ``rows``:
    per-question rows (``phase`` ``"test"`` or ``"train"``).
    """

    experiment: ClassVar[str] = "learning"

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        budgets = [str(b) for b in config.get("budgets", list(BUDGETS))]
        views = budgets + ["respond"]
        head = f"{'arm':<14}{'R@' + budgets[0] + ' before':>12}{'after':>7}"
        head += "".join(f"{'Δ ' + ('R@' + v if v != 'respond' else 'shown') + ' [95% CI]':>24}" for v in views)
        head += f"{'learning: shown':>17}{'greedy':>8}{'shown-greedy [95% CI]':>24}{'explored':>9}"
        lines = [head]
        for arm, v in metrics.items():
            if arm == "rows":
                continue
            h = v["heldout"]
            line = f"{arm:<14}{h[budgets[0]]['before']:>12.3f}{h[budgets[0]]['after']:>7.3f}"
            line += "".join(f"{_pts(h[x]['delta'], h[x]['delta_lo'], h[x]['delta_hi']) if x in h else '':>24}"
                            for x in views)
            sm = v.get("shown_minus_greedy")
            line += (f"{v['shown']:>17.3f}{v['greedy']:>8.3f}{_pts(sm['delta'], sm['delta_lo'], sm['delta_hi']):>24}"
                     f"{v['explored']:>9.2f}" if sm is not None
                     else f"{'(not through RMM)':>17}")
            lines.append(line)
        return "\n".join(lines)


def _pts(m: float, lo: float, hi: float) -> str:
    return f"{100 * m:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def _recall(keys: Sequence[Any], evidence: set[str]) -> float:
    return len({str(k) for k in keys} & evidence) / len(evidence)


@dataclass
class _Bank:
    conv: Conversation
    store: Any
    namespace: str
    questions: list[Question]


def _build_bank(conv: Conversation, emb: Any, root: str, rmm_kwargs: dict, categories: Sequence[str] | None) -> _Bank:
    from ..loops.rmm import RMM
    from ..store.engine import MemoryStore
    from .retrieval import turn_dicts

    store = MemoryStore(f"{root}/{conv.conversation_id}", dim=int(emb.dim))
    kw = dict(extractor="embedding", persist=False) | dict(rmm_kwargs)
    comp = {k: kw.pop(k) for k in ("extractor", "decider") if k in kw}
    writer = RMM(store, embedder=emb, namespace="user", **comp, **kw)
    for s, sess in zip(turn_dicts(conv), conv.sessions):
        writer.end_session([{k: v for k, v in t.items() if k != "date"} for t in s], session_id=sess.session_id,
                           date=sess.date)
    qs = [q for q in conv.questions if q.evidence_turn_ids
          and (q.question_type in categories if categories is not None else q.question_type not in ADVERSARIAL)]
    return _Bank(conv, store, "user", qs)


def _split(n: int, test_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_frac)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _arm_explore(arm: str) -> float:
    return float(arm.split("=", 1)[1]) if arm.startswith("explore=") else 0.0


@dataclass
class LearningExperiment(Experiment):
    """The learning work plan: one configuration (every arm shares the banks), cut by conversation
    unless ``pool`` (then the shared reranker carries state from one conversation to the next).
    Options: see :func:`run_learning`."""

    name: ClassVar[str] = "learning"

    arms: tuple[str, ...] = ARMS
    splits: int = 3
    test_frac: float = 0.5
    pool: bool = False
    batch_size: int = 4
    budgets: tuple[int, ...] = BUDGETS
    categories: tuple[str, ...] | None = None
    rmm_kwargs: dict[str, Any] | None = None
    reranker_kwargs: dict[str, Any] | None = None
    k: int = 20
    seed: int = 0

    def configurations(self, ds: Dataset) -> list[str]:
        return ["all"]

    def conversations(self, ds: Dataset, config: str) -> int | None:
        return None if self.pool else len(ds.conversations)

    def _reranker(self, dim: int, top_m: int, seed: int) -> Any:
        from ..loops.rmm.feedback import default_reranker

        return default_reranker(dim, top_m, seed, **(self.reranker_kwargs or {}))

    def run_task(self, ds: Dataset, task: Task, emb: Any) -> dict[str, Any]:
        convs = [ds.conversations[i] for i in (task.conversations if task.conversations is not None
                                                else range(len(ds.conversations)))]
        rows: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        tm = {"banks": 0.0, "arms": 0.0}
        with tempfile.TemporaryDirectory(prefix="memkern-learning-") as root:
            banks = [_build_bank(c, emb, root, dict(self.rmm_kwargs or {}), self.categories) for c in convs]
            tm["banks"] = time.perf_counter() - t0
            try:
                for sp in range(self.splits):
                    split_seed = self.seed * 1000 + sp
                    parts = [_split(len(b.questions), self.test_frac, split_seed + 7 * j) for j, b in enumerate(banks)]
                    for arm in self.arms:
                        t1 = time.perf_counter()
                        if arm == "direct":
                            rows += self._direct(banks, parts, emb, split_seed, sp)
                        else:
                            rows += self._through_rmm(arm, banks, parts, emb, split_seed, sp)
                        tm["arms"] += time.perf_counter() - t1
            finally:
                for b in banks:
                    b.store.close()
        return {"rows": rows, "timings": tm}

    # ---- arms through RMM.respond
    def _through_rmm(self, arm: str, banks: list[_Bank], parts, emb: Any, split_seed: int, sp: int) -> list[dict]:
        from ..loops.rmm import RMM

        kw = dict(extractor="embedding", persist=False) | dict(self.rmm_kwargs or {})
        comp = {k: kw.pop(k) for k in ("extractor", "decider") if k in kw}
        kw.update(batch_size=self.batch_size, seed=split_seed, explore=_arm_explore(arm))
        top_m = int(kw.get("top_m", 5))
        keys = {}
        for b in banks:
            for q in b.questions:
                keys.setdefault(q.question, []).extend(evidence_keys(b.conv, q))
        chat = CitingChat(keys)
        shared = self._reranker(int(emb.dim), top_m, split_seed) if self.pool else None

        def wrap(rr: Any) -> Any:
            if arm == "hidden":
                return HiddenSampleReranker(rr)
            if arm == "swap-last":
                return SwapLastReranker(rr, 0.3, split_seed)
            return rr

        rmms, fresh = [], []
        for b in banks:
            rr = shared if shared is not None else self._reranker(int(emb.dim), top_m, split_seed)
            rmms.append(RMM(b.store, chat_model=chat, embedder=emb, reranker=wrap(rr), namespace=b.namespace,
                            **comp, **kw))
            fresh.append(RMM(b.store, chat_model=chat, embedder=emb, reranker=self._reranker(int(emb.dim), top_m,
                                                                                             split_seed),
                             namespace=b.namespace, **comp, **kw))
        rows: list[dict] = []
        # the training stream: each conversation's questions in a seeded order, one conversation after
        # the other; pooled, all of them interleaved in one seeded order
        stream = [(j, int(i)) for j, (tr, _) in enumerate(parts)
                  for i in np.random.default_rng(split_seed + 99 + j).permutation(tr)]
        if self.pool:
            stream = [stream[int(n)] for n in np.random.default_rng(split_seed + 99).permutation(len(stream))]
        for j, i in stream:
            b, r = banks[j], rmms[j]
            q = b.questions[i]
            ev = set(q.evidence_turn_ids)
            greedy = r.retrieve(q.question)
            resp = r.respond(q.question)
            shown = [self._turn_keys(b.store, ids) for ids in resp.turn_ids]
            rows.append(dict(arm=arm, split=sp, phase="train", conversation=b.conv.conversation_id,
                             question_id=q.question_id, question_type=q.question_type,
                             shown=_recall([k for ks in shown for k in ks], ev),
                             greedy=_recall(greedy.all_turn_ids, ev), explored=bool(resp.explored),
                             reward_rate=float(np.mean([x > 0 for x in resp.rewards])) if resp.rewards else math.nan))
        for r in rmms:
            r.flush()
        for j, b in enumerate(banks):
            for i in parts[j][1]:
                q = b.questions[int(i)]
                ev = set(q.evidence_turn_ids)
                row = dict(arm=arm, split=sp, phase="test", conversation=b.conv.conversation_id,
                           question_id=q.question_id, question_type=q.question_type,
                           updates=int(rmms[j].reranker.steps))
                for bud in self.budgets:
                    row[f"before@{bud}"] = _recall(fresh[j].retrieve(q.question, turns=bud).all_turn_ids, ev)
                    row[f"after@{bud}"] = _recall(rmms[j].retrieve(q.question, turns=bud).all_turn_ids, ev)
                # what respond would show for it (top_m memories, their shown turns)
                row["before@respond"] = _recall(fresh[j].retrieve(q.question).all_turn_ids, ev)
                row["after@respond"] = _recall(rmms[j].retrieve(q.question).all_turn_ids, ev)
                rows.append(row)
        return rows

    @staticmethod
    def _turn_keys(store: Any, record_ids: Sequence[int]) -> list[Any]:
        from ..loops.rmm.retrieve import turn_key

        return [turn_key(rec.turn) for rec in store.get_batch(list(record_ids))] if record_ids else []

    # ---- the Reranker fed directly (reflection's setting)
    def _direct(self, banks: list[_Bank], parts, emb: Any, split_seed: int, sp: int) -> list[dict]:
        import torch

        from .online import build_candidates, simulate_citations

        top_m = int((self.rmm_kwargs or {}).get("top_m", 5))
        sub = Dataset("learning-direct", [dataclasses.replace(b.conv, questions=list(b.questions)) for b in banks], {})
        cands = build_candidates(sub, emb, k=self.k)
        # rows of cands follow the conversations' question lists in order
        offs = np.cumsum([0] + [len(b.questions) for b in banks])
        rng = np.random.default_rng(split_seed + 7919)
        rows: list[dict] = []
        shared = self._reranker(int(emb.dim), top_m, split_seed) if self.pool else None
        groups = [[(j, offs[j] + parts[j][0])] for j in range(len(banks))] if not self.pool else \
            [[(j, offs[j] + parts[j][0]) for j in range(len(banks))]]
        for grp in groups:
            rr = shared if shared is not None else self._reranker(int(emb.dim), top_m, split_seed)
            train = np.concatenate([t for _, t in grp])
            stream = np.random.default_rng(split_seed + 99).permutation(train)
            for s in range(0, len(stream), self.batch_size):
                r = stream[s:s + self.batch_size]
                sel = rr.select(torch.from_numpy(cands.q[r]), torch.from_numpy(cands.cand[r]),
                                mask=torch.from_numpy(cands.mask[r]))
                idx = sel.indices.cpu().numpy()
                rew = simulate_citations(idx, cands.useful[r], rng, 1.0, 0.0)
                rr.update(sel, torch.from_numpy(rew))
            for j, _ in grp:
                test = offs[j] + parts[j][1]
                with torch.no_grad():
                    after = rr.select(torch.from_numpy(cands.q[test]), torch.from_numpy(cands.cand[test]),
                                      mask=torch.from_numpy(cands.mask[test]), greedy=True,
                                      m=min(max(self.budgets), cands.cand.shape[1])).indices.cpu().numpy()
                for n, row_i in enumerate(test):
                    q = banks[j].questions[int(row_i - offs[j])]
                    ev_n = max(int(cands.ev_count[row_i]), 1)
                    row = dict(arm="direct", split=sp, phase="test", conversation=banks[j].conv.conversation_id,
                               question_id=q.question_id, question_type=q.question_type, updates=rr.steps)
                    for bud in self.budgets:
                        u = cands.useful[row_i]
                        row[f"before@{bud}"] = float(u[:bud].sum()) / ev_n
                        a = after[n][:bud]
                        row[f"after@{bud}"] = float(u[a[a >= 0]].sum()) / ev_n
                    rows.append(row)
        return rows

    # ---- merge
    def merge(self, ds: Dataset, outputs: Sequence[TaskOutput], emb: Any) -> "LearningResult":
        rows = [r for o in outputs for r in o.partial["rows"]]
        metrics: dict[str, Any] = {}
        for arm in self.arms:
            test = [r for r in rows if r["arm"] == arm and r["phase"] == "test"]
            train = [r for r in rows if r["arm"] == arm and r["phase"] == "train"]
            qid = np.array([r["question_id"] for r in test])
            held: dict[str, Any] = {}
            views = [str(b) for b in self.budgets] + (["respond"] if test and "before@respond" in test[0] else [])
            for bud in views:
                before = np.array([r[f"before@{bud}"] for r in test])
                after = np.array([r[f"after@{bud}"] for r in test])
                d, lo, hi = bootstrap_ci(after - before, qid, seed=self.seed)
                held[bud] = dict(before=float(before.mean()) if len(test) else math.nan,
                                      after=float(after.mean()) if len(test) else math.nan,
                                      delta=d, delta_lo=lo, delta_hi=hi, questions=len(test))
            m: dict[str, Any] = dict(heldout=held, updates=mean([r["updates"] for r in test]))
            b0 = self.budgets[0]
            m["by_conversation"] = {c: mean([r[f"after@{b0}"] - r[f"before@{b0}"] for r in test
                                             if r["conversation"] == c])
                                    for c in dict.fromkeys(r["conversation"] for r in test)}
            if train:
                sh = np.array([r["shown"] for r in train])
                gr = np.array([r["greedy"] for r in train])
                d, lo, hi = bootstrap_ci(sh - gr, np.array([r["question_id"] for r in train]), seed=self.seed)
                m.update(shown=float(sh.mean()), greedy=float(gr.mean()),
                         shown_minus_greedy=dict(delta=d, delta_lo=lo, delta_hi=hi),
                         explored=mean([float(r["explored"]) for r in train]),
                         reward_rate=mean([r["reward_rate"] for r in train]), calls=len(train))
            metrics[arm] = m
        metrics["rows"] = rows
        timings = sum_timings(outputs)
        timings["total"] = timings["tasks"]
        config = dict(experiment="learning", arms=list(self.arms), splits=self.splits, test_frac=self.test_frac,
                      pool=self.pool, batch_size=self.batch_size, budgets=list(self.budgets),
                      categories=None if self.categories is None else list(self.categories), rmm_kwargs=dict(self.rmm_kwargs or {}),
                      reranker_kwargs=dict(self.reranker_kwargs or {}), k=self.k, seed=self.seed,
                      embedder=emb.model_name, citations="a shown memory holding an evidence turn is cited",
                      interval="per-question bootstrap, 95%, 2000 resamples")
        return LearningResult(config, dataset_info(ds), metrics, timings, environment())


def learning_experiment(*, arms: Sequence[str] = ARMS, splits: int = 3, test_frac: float = 0.5, pool: bool = False,
                        batch_size: int = 4, budgets: Sequence[int] = BUDGETS,
                        categories: Sequence[str] | None = None, rmm_kwargs: dict | None = None,
                        reranker_kwargs: dict | None = None, k: int = 20, seed: int = 0) -> LearningExperiment:
    """A checked :class:`LearningExperiment` (the arguments of :func:`run_learning`)."""
    for a in arms:
        if a not in ARMS and not (a.startswith("explore=") and _is_share(a.split("=", 1)[1])):
            raise bad_arg("arms", f"names among {ARMS} or explore=<share in [0, 1]>", a)
    for name, v in (("splits", splits), ("batch_size", batch_size), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad_arg(name, "an int >= 1", v)
    if not 0.0 < float(test_frac) < 1.0:
        raise bad_arg("test_frac", "a float in (0, 1)", test_frac)
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise bad_arg("budgets", "ints >= 1", b)
    return LearningExperiment(arms=tuple(arms), splits=splits, test_frac=float(test_frac), pool=bool(pool),
                              batch_size=batch_size, budgets=tuple(budgets),
                              categories=None if categories is None else tuple(categories),
                              rmm_kwargs=dict(rmm_kwargs) if rmm_kwargs else None,
                              reranker_kwargs=dict(reranker_kwargs) if reranker_kwargs else None, k=k, seed=seed)


def _is_share(text: str) -> bool:
    try:
        v = float(text)
    except ValueError:
        return False
    return 0.0 <= v <= 1.0


def run_learning(ds: Dataset, *, emb: Any = None, progress: bool = False, conversations_per_task: int = 4,
                 **kwargs: Any) -> LearningResult:
    """Run the learning experiment here (module doc); ``kwargs``: :func:`learning_experiment`'s.

    Parameters
    ----------
    ds : Dataset
    emb : memkern.eval.units.CachedEmbedder, optional
        Default: the offline MiniLM with the on-disk cache.
    arms : sequence of str
        :data:`ARMS` names, or ``explore=<share>``.
    splits : int
        Random train / held-out splits (each a fresh reranker per arm).
    pool : bool
        One reranker for every conversation (module doc).
    categories : sequence of str, optional
        Question types to use (default: all but :data:`ADVERSARIAL`).
    rmm_kwargs, reranker_kwargs : dict, optional
        :class:`memkern.RMM` settings (default: RMM's defaults with the embedding extractor) and
        settings of the fresh reranker (:func:`memkern.loops.rmm.feedback.default_reranker`).
    """
    from .tasks import run_local
    from .units import CachedEmbedder

    return run_local(learning_experiment(**kwargs), ds, emb or CachedEmbedder(), conversations_per_task,
                     progress=progress)
