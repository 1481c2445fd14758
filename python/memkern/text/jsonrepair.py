"""Robust parsing of the JSON that small and local chat models really emit.

Small models (SmolLM2-135M, quantised 1-3B models, ...) asked for JSON commonly produce:

- the JSON inside a Markdown code fence (```json ... ```), often with prose before or after;
- text after the first complete object (they keep generating), or a second object;
- Python literals: single-quoted strings, ``True`` / ``False`` / ``None``;
- trailing commas before ``}`` or ``]``;
- an object cut off by ``max_new_tokens`` (unclosed strings and brackets);
- smart quotes, unquoted keys, comments.

:func:`parse_json` locates the first JSON value in the text and applies, in order, only as many
repairs as needed: plain ``json.loads`` -> light textual repairs -> ``ast.literal_eval`` (Python
literal syntax) -> closing a truncated value. It never evaluates code. When nothing parses it
raises :class:`JSONRepairError` (a ``ValueError``) carrying the raw text, so callers can retry
or log a skip.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any

from ..errors import MemkernValueError

__all__ = ["JSONRepairError", "parse_json", "extract_json_span"]


class JSONRepairError(MemkernValueError):
    """No JSON value could be recovered from a model's output; ``.text`` holds that output."""

    def __init__(self, message: str, text: str):
        super().__init__(message)
        self.text = text


_FENCE = re.compile(r"```(?:json|JSON|javascript|js|python)?\s*\n?(.*?)(?:```|$)", re.S)
_SMART = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u00a0": " "})
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_UNQUOTED_KEY = re.compile(r'([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)(\s*:)')
_LINE_COMMENT = re.compile(r"^\s*//.*$", re.M)


def extract_json_span(text: str, start_chars: str = "{[") -> tuple[str, bool]:
    """Return the first balanced JSON-looking span of ``text`` and whether it was closed.

    Scans from the first character in ``start_chars``, tracking strings (both quote kinds) and
    bracket depth. If the text ends before the value closes, the partial span is returned with
    ``closed=False`` (the caller may try to close it).

    Parameters
    ----------
    text : str
        Model output.
    start_chars : str
        Characters that may open the value (``"{"`` for objects only, ``"{["`` for both).

    Returns
    -------
    (span, closed) : tuple[str, bool]
        ``("", False)`` when no opening character is found.
    """
    positions = [p for p in (text.find(c) for c in start_chars) if p >= 0]
    if not positions:
        return "", False
    start = min(positions)
    stack: list[str] = []
    quote: str | None = None
    escape = False
    pairs = {"{": "}", "[": "]"}
    for i in range(start, len(text)):
        ch = text[i]
        if quote is not None:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            # An apostrophe inside a bare word (e.g. don't) is not a string opener.
            if ch == "'" and i > 0 and text[i - 1].isalnum():
                continue
            quote = ch
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in "}]":
            if stack and stack[-1] == ch:
                stack.pop()
                if not stack:
                    return text[start : i + 1], True
            else:  # mismatched closer: stop here, treat as truncated
                return text[start:i], False
    return text[start:], False


def _close_truncated(span: str) -> str:
    """Close the open string and brackets of a truncated JSON value (best effort)."""
    stack: list[str] = []
    quote: str | None = None
    escape = False
    for i, ch in enumerate(span):
        if quote is not None:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            if ch == "'" and i > 0 and span[i - 1].isalnum():
                continue
            quote = ch
        elif ch == "{":
            stack.append("}")
        elif ch == "[":
            stack.append("]")
        elif ch in "}]" and stack:
            stack.pop()
    out = span
    if quote is not None:
        out += quote
    out = out.rstrip()
    # A dangling key or comma cannot be closed meaningfully: drop it.
    out = re.sub(r",\s*$", "", out)
    out = re.sub(r'[,{]\s*"[^"]*"\s*:\s*$', lambda m: m.group(0)[0] if m.group(0)[0] == "{" else "", out)
    out = re.sub(r":\s*$", ': null', out)
    return out + "".join(reversed(stack))


def _light_repairs(s: str) -> str:
    s = s.translate(_SMART)
    s = _LINE_COMMENT.sub("", s)
    s = _TRAILING_COMMA.sub(r"\1", s)
    s = _UNQUOTED_KEY.sub(r'\1"\2"\3', s)
    return s


def _try_parse(s: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(s)
    except (ValueError, RecursionError):
        pass
    fixed = _light_repairs(s)
    try:
        return True, json.loads(fixed)
    except (ValueError, RecursionError):
        pass
    # Python literal syntax: single quotes, True/False/None, tuples. literal_eval never runs code.
    py = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", fixed)))
    try:
        value = ast.literal_eval(py)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None
    if isinstance(value, tuple):
        value = list(value)
    return isinstance(value, (dict, list)), value


def parse_json(text: str, expect: type | tuple[type, ...] | None = None) -> Any:
    """Parse the first JSON value in a model's output, repairing common small-model damage.

    Parameters
    ----------
    text : str
        Raw model output.
    expect : type or tuple of types, optional
        Required type of the result (``dict`` or ``list``); a value of another type is skipped
        and the next candidate (e.g. the text outside a code fence) is tried.

    Returns
    -------
    dict or list

    Raises
    ------
    JSONRepairError
        When no JSON value can be recovered, or it has the wrong type.
    """
    if not isinstance(text, str):
        raise JSONRepairError(f"text: expected str, got {type(text).__name__}", str(text))
    candidates: list[str] = []
    for m in _FENCE.finditer(text):
        body = m.group(1).strip()
        if body:
            candidates.append(body)
    candidates.append(text)
    start_chars = "{" if expect is dict else ("[" if expect is list else "{[")
    errors = []
    for cand in candidates:
        span, closed = extract_json_span(cand, start_chars)
        if not span:
            continue
        attempts = [span] if closed else [span, _close_truncated(span)]
        for attempt in attempts:
            ok, value = _try_parse(attempt)
            if ok:
                if expect is not None and not isinstance(value, expect):
                    errors.append(f"parsed a {type(value).__name__}, expected {expect}")
                    continue
                return value
        errors.append("unparseable span")
    snippet = text if len(text) <= 200 else text[:200] + "..."
    detail = "; ".join(errors) if errors else "no '{' or '[' found"
    raise JSONRepairError(f"model output: expected a JSON value ({detail}), got {snippet!r}", text)


def coerce_int(x: Any) -> int | None:
    """An integer a model wrote as ``3``, ``3.0``, ``"3"`` or ``"[3]"`` (``None`` if there is
    none; bools are not integers here). Callers range-check the result."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str):
        m = re.search(r"-?\d+", x)
        return int(m.group(0)) if m else None
    return None

