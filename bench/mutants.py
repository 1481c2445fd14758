"""The mutation check's catalogue: one deliberate bug per entry, with the tests meant to catch it.

Each :class:`Mutant` replaces an exact snippet of one file (it must occur ``count`` times, so a
refactor that moves the code makes the mutant an *error* in ``bench/mutation.py --check`` rather
than silently testing nothing). ``native=True`` marks C++ files (the extension is rebuilt).
``equivalent`` holds the explanation for a mutant that cannot change behaviour.

House rule (README, conventions): a new mechanism comes with a mutant here that proves its test
can fail.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    id: str
    area: str
    file: str
    find: str
    replace: str
    what: str
    tests: tuple[str, ...]
    count: int = 1
    equivalent: str = ""

    @property
    def native(self) -> bool:
        return self.file.startswith("csrc/")


T_RMM = ("tests/test_rmm.py", "tests/test_rmm_turns.py")
T_UPDATE = ("tests/test_update.py", "tests/test_rmm.py", "tests/test_rmm_turns.py")
T_MEMREREAD = ("tests/test_memreread.py",)
T_PATHS = ("tests/test_cli_errors.py", "tests/test_cli.py", "tests/test_rmm.py")
T_LOCOMO = ("tests/test_locomo.py", "tests/test_sessions.py")
T_LME = ("tests/test_longmemeval.py", "tests/test_sessions.py")

CATALOGUE: list[Mutant] = [
    # ---------------------------------------------------------------- reward mapping (RMM)
    Mutant("rmm-reward-sign", "rewards", "python/memkern/rmm.py",
           "rewards = [1.0 if i in cites else -1.0 for i in range(len(m_sel))]",
           "rewards = [-1.0 if i in cites else 1.0 for i in range(len(m_sel))]",
           "cited memories get -1 and uncited +1", T_RMM),
    Mutant("rmm-reward-uncited-zero", "rewards", "python/memkern/rmm.py",
           "rewards = [1.0 if i in cites else -1.0 for i in range(len(m_sel))]",
           "rewards = [1.0 if i in cites else 0.0 for i in range(len(m_sel))]",
           "uncited memories get 0 instead of -1", T_RMM),
    Mutant("rmm-batch-off-by-one", "rewards", "python/memkern/rmm.py",
           "if len(self._buffer) >= self.batch_size:",
           "if len(self._buffer) > self.batch_size:",
           "the reranker updates every batch_size + 1 responses", T_RMM),
    Mutant("rmm-flush-keeps-buffer", "rewards", "python/memkern/rmm.py",
           "        self._buffer.clear()\n",
           "\n",
           "buffered rewards are fed to the reranker again at every flush", T_RMM),
    # ---------------------------------------------------------------- update semantics
    Mutant("update-turnkey-ignores-content", "update", "python/memkern/update.py",
           'return (t.get("session_id"), t.get("turn_index"), t.get("role"), t.get("content"))',
           'return (t.get("session_id"), t.get("turn_index"), t.get("role"))',
           "two different turns at the same position count as the same turn", T_UPDATE),
    Mutant("update-union-drops-new", "update", "python/memkern/update.py",
           "            seen.add(k)\n            out.append(t)\n",
           "            seen.add(k)\n",
           "a merge forgets the new raw turns", T_UPDATE),
    Mutant("update-noop-threshold", "update", "python/memkern/update.py",
           "if s >= self.noop_threshold:",
           "if s >= self.merge_threshold:",
           "every MERGE-range similarity becomes a NOOP (new information lost)", T_UPDATE),
    Mutant("update-merge-to-add", "update", "python/memkern/update.py",
           "elif s >= self.merge_threshold:",
           "elif s > 1.0:",
           "similar memories are never merged, always added", T_UPDATE),
    Mutant("update-invalidate-not-marked", "update", "python/memkern/update.py",
           "        store.invalidate(target_id, summary)\n",
           "\n",
           "INVALIDATE adds the withdrawal but leaves the withdrawn fact active", T_UPDATE),
    Mutant("update-bad-index-accepted", "update", "python/memkern/update.py",
           "if idx is None or not 0 <= idx < len(cands):",
           "if idx is None or not 0 <= idx <= len(cands):",
           "a model-written index one past the candidates is accepted", T_UPDATE),
    Mutant("update-inactive-target-used", "update", "python/memkern/update.py",
           "if target is None or not _is_active(target):",
           "if target is None:",
           "a decision can MERGE into an invalidated memory", T_UPDATE),
    # ---------------------------------------------------------------- MemReread budgets
    Mutant("memreread-cap-after-integrate", "memreread", "python/memkern/memreread.py",
           "memory = self.cap_memory(self.keep_confirmed(memory, new))",
           "memory = self.keep_confirmed(memory, new)",
           "the memory cap is not enforced after the integrate step", T_MEMREREAD),
    Mutant("memreread-cap-after-read", "memreread", "python/memkern/memreread.py",
           "                memory = self.cap_memory(out)\n",
           "                memory = out\n",
           "the memory cap is not enforced while streaming chunks", T_MEMREREAD),
    Mutant("memreread-extra-reread", "memreread", "python/memkern/memreread.py",
           "while res.rereads < self.max_rereads:",
           "while res.rereads <= self.max_rereads:",
           "one reread more than max_rereads", T_MEMREREAD),
    Mutant("memreread-confirmed-dropped", "memreread", "python/memkern/memreread.py",
           "if P.CONFIRMED_TAG in line and _strip_tag(line) not in have:",
           "if False:",
           "integrate loses [confirmed] facts the model dropped", T_MEMREREAD),
    Mutant("memreread-repeat-allowed", "memreread", "python/memkern/memreread.py",
           "if c == nq or _jaccard(c, nq) >= self.repeat_threshold:",
           "if c == nq and _jaccard(c, nq) >= self.repeat_threshold:",
           "near-repeat sub-questions are reread again", T_MEMREREAD),
    # ---------------------------------------------------------------- loader field mapping
    Mutant("locomo-no-comma-split", "loaders", "python/memkern/data/locomo.py",
           '_EVIDENCE_SPLIT = re.compile(r"[;,\\s]+")', '_EVIDENCE_SPLIT = re.compile(r"[;\\s]+")',
           "evidence ids joined with commas are read as one unknown id", T_LOCOMO),
    Mutant("locomo-no-semicolon-split", "loaders", "python/memkern/data/locomo.py",
           '_EVIDENCE_SPLIT = re.compile(r"[;,\\s]+")', '_EVIDENCE_SPLIT = re.compile(r"[,\\s]+")',
           "evidence ids joined with '; ' are read as one unknown id", T_LOCOMO),
    Mutant("locomo-roles-swapped", "loaders", "python/memkern/data/locomo.py",
           'role = "user" if speaker == spk_a else',
           'role = "assistant" if speaker == spk_a else',
           "speaker_a's turns are given the assistant role", T_LOCOMO),
    Mutant("locomo-speaker-dropped", "loaders", "python/memkern/data/locomo.py",
           "sess.turns.append(Turn(dia, role, text, sid, k, sess.date, speaker, False))",
           "sess.turns.append(Turn(dia, role, text, sid, k, sess.date, role, False))",
           "the speaker's name is lost (role kept instead)", T_LOCOMO),
    Mutant("locomo-adversarial-ignored", "loaders", "python/memkern/data/locomo.py",
           'answer = _answer(item["adversarial_answer"], f"{qw}.adversarial_answer")',
           'answer = ""',
           "category-5 questions lose their adversarial answer", T_LOCOMO),
    Mutant("locomo-category-unchecked", "loaders", "python/memkern/data/locomo.py",
           "    if cat not in LOCOMO_CATEGORIES:\n",
           "    if False:\n",
           "categories outside 1-5 are accepted", T_LOCOMO),
    Mutant("lme-evidence-any-session", "loaders", "python/memkern/data/longmemeval.py",
           "evid = [t.turn_id for s in sessions if s.session_id in ans_sids for t in s.turns if t.has_answer]",
           "evid = [t.turn_id for s in sessions for t in s.turns if t.has_answer]",
           "has_answer turns outside the answer sessions count as evidence", T_LME),
    Mutant("lme-date-dropped", "loaders", "python/memkern/data/longmemeval.py",
           "sess = Session(sid, None if date is None else str(date))",
           "sess = Session(sid, None)",
           "haystack session dates are lost", T_LME),
    # ---------------------------------------------------------------- namespace isolation (files)
    Mutant("paths-dotdot-allowed", "isolation", "python/memkern/paths.py",
           'if not _NAMESPACE_RE.fullmatch(name) or ".." in name:',
           "if not _NAMESPACE_RE.fullmatch(name):",
           "namespace names with '..' pass the check", T_PATHS),
    Mutant("paths-slash-allowed", "isolation", "python/memkern/paths.py",
           'NAMESPACE_PATTERN = r"[A-Za-z0-9_@:-][A-Za-z0-9_.@:-]{0,127}"',
           'NAMESPACE_PATTERN = r"[A-Za-z0-9_@:/-][A-Za-z0-9_./@:-]{0,127}"',
           "namespace names may hold '/' (a path)", T_PATHS),
    Mutant("paths-escape-allowed", "isolation", "python/memkern/paths.py",
           "if os.path.commonpath([base, target]) != base or target == base:",
           "if target == base:",
           "a path resolving outside the store folder (through a link) is accepted", T_PATHS),
]
