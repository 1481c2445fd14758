"""What the chat backends share: the prompt contract (a list of str or message lists), the
generation-argument checks, and JSON stopping (:class:`JsonScanner`, :func:`first_json`)."""
from __future__ import annotations

from typing import Any, Sequence, Union

from ..errors import MemkernTypeError, bad_arg
from ..base.validate import check_choice, check_float, check_int

Message = dict
Prompt = Union[str, Sequence[Message]]

__all__ = ["JsonScanner", "first_json", "Message", "Prompt"]


class JsonScanner:
    """Incremental scanner finding the end of the first complete JSON object in a text stream.

    Text before the first ``{`` (e.g. a code fence) is skipped. Braces inside double-quoted
    strings (with backslash escapes) do not count. ``kind="array"`` tracks ``[`` ... ``]`` instead.

    ``feed(chunk)`` returns True once the object is complete; ``start``/``end`` are then the
    character offsets of the object in the concatenated stream (``end`` exclusive).
    """

    __slots__ = ("open", "close", "depth", "in_string", "escape", "start", "end", "pos")

    def __init__(self, kind: str = "object"):
        check_choice("kind", kind, ("object", "array"))
        self.open, self.close = ("{", "}") if kind == "object" else ("[", "]")
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.start: int | None = None
        self.end: int | None = None
        self.pos = 0

    @property
    def done(self) -> bool:
        return self.end is not None

    def feed(self, chunk: str) -> bool:
        if self.end is not None:
            return True
        for ch in chunk:
            p = self.pos
            self.pos += 1
            if self.start is None:
                if ch == self.open:
                    self.start, self.depth = p, 1
                continue
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                continue
            if ch == '"':
                self.in_string = True
            elif ch == self.open:
                self.depth += 1
            elif ch == self.close:
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.pos
                    return True
        return False


def _json_kind(json: Any) -> str | None:
    if json is False or json is None:
        return None
    if json is True or json == "object":
        return "object"
    if json == "array":
        return "array"
    raise bad_arg("json", "False, True, 'object' or 'array'", json)


def first_json(text: str, kind: str = "object") -> str | None:
    """The first complete JSON object (or array) in ``text`` as a substring, else ``None``."""
    sc = JsonScanner(kind)
    if sc.feed(text):
        return text[sc.start:sc.end]
    return None


def _trim_json(text: str, kind: str | None) -> str:
    if kind is None:
        return text
    found = first_json(text, kind)
    return found if found is not None else text


def _check_prompts(prompts: Any) -> list[list[dict]]:
    """Normalise prompts to lists of chat messages; validate types."""
    if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], dict)):
        raise bad_arg("prompts", "a list of prompts (each a str or a list of message dicts); "
                      "wrap a single prompt in a list", type(prompts).__name__, MemkernTypeError)
    if not isinstance(prompts, (list, tuple)):
        raise bad_arg("prompts", "a list of str or of message lists", type(prompts).__name__, MemkernTypeError)
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append([{"role": "user", "content": p}])
        elif isinstance(p, (list, tuple)) and p:
            for j, m in enumerate(p):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise bad_arg(f"prompts[{i}][{j}]", "a dict with str 'role' and 'content'", m, MemkernTypeError)
            out.append([dict(m) for m in p])
        else:
            raise bad_arg(f"prompts[{i}]", "a str or a non-empty list of message dicts", p, MemkernTypeError)
    return out


def _check_gen_args(max_new_tokens: Any, temperature: Any) -> None:
    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens, 1, expected="a positive int")
    check_float("temperature", temperature, 0)
