"""A scripted chat backend for the MemReread loop (read / decompose / integrate / answer by prompt), and
its small test document: shared by the loop's tests and the MemReread evaluation's."""
from __future__ import annotations

import json as _json
import re

from memkern.loops.memreread import prompts as P


ROLE_OF = {P.READ_SYSTEM: "read", P.DECOMPOSE_SYSTEM: "decompose", P.INTEGRATE_SYSTEM: "integrate",
           P.ANSWER_SYSTEM: "answer"}


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}: (.*)$", text, re.M)
    return m.group(1) if m else ""


def _block(text: str, start: str, end: str) -> str:
    i = text.index(start) + len(start)
    j = text.index(end, i)
    return text[i:j].strip()


class FakeChat:
    """Deterministic stand-in for a chat model (orchestration tests only).

    read: keeps the old notes and adds the chunk's sentences that contain a word of the question
    (capitalised words only); answer: the last note line, or "unknown"; decompose / integrate:
    given by the test (functions of the parsed prompt). One token = one whitespace word.
    """

    def __init__(self, decompose=None, integrate=None, read=None):
        self.decompose = decompose or (lambda q, notes, asked, n: {"enough": True})
        self.integrate = integrate or (lambda q, notes, sq, sa: notes + "\n" + sa)
        self.read = read
        self.batches: list[list[str]] = []  # roles of each generate call
        self.n_decompose = 0

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def _read(self, user: str) -> str:
        q = _field(user, "Question")
        notes = _block(user, "Notes so far:\n", "\n\nPiece ")
        notes = "" if notes == P.EMPTY_MEMORY else notes
        chunk = user.split("Piece ", 1)[1].split(":\n", 1)[1].rsplit("\n\nWrite the updated notes.", 1)[0]
        keys = {w.strip("?.,").lower() for w in q.split() if w[:1].isupper()}
        found = [s.strip() + "." for s in chunk.split(".")
                 if s.strip() and keys & {w.strip(",").lower() for w in s.split()}]
        lines = [l for l in notes.splitlines() if l.strip()] + [f for f in found if f not in notes]
        return "\n".join(lines)

    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        roles, outs = [], []
        for p in prompts:
            role = ROLE_OF[p[0]["content"]]
            user = p[-1]["content"]
            roles.append(role)
            if role == "read":
                outs.append(self.read(user) if self.read else self._read(user))
            elif role == "answer":
                notes = _block(user, "Notes:\n", "\n\nQuestion: ")
                lines = [l for l in notes.splitlines() if l.strip() and l != P.EMPTY_MEMORY]
                outs.append(lines[-1] if lines else "unknown")
            elif role == "decompose":
                self.n_decompose += 1
                q = _field(user, "Question")
                notes = _block(user, "Notes:\n", "\nAlready asked: ")
                asked = user.split("Already asked: ", 1)[1]
                r = self.decompose(q, notes, asked, self.n_decompose)
                outs.append(r if isinstance(r, str) else _json.dumps(r))
            else:
                q = _field(user, "Question")
                notes = _block(user, "Notes:\n", "\n\nSub-question: ")
                outs.append(self.integrate(q, notes, _field(user, "Sub-question"), _field(user, "Sub-answer")))
        self.batches.append(roles)
        return outs


DOC = ("Filler sentence one about nothing. The Zorblat code is 4417. More filler text here. "
       "Another line of filler. The Quix river flows north. Even more filler words appear. "
       "Final filler sentence closes the text.")
