"""Scopes (mem0's ``user_id`` / ``agent_id`` / ``run_id``) to memkern namespaces, and back.

A memory belongs to exactly one *scope*: a combination of a user, an agent and a run (session),
at least one of them given. The scope is one memkern namespace, encoded as

    u:<user_id>[:a:<agent_id>][:r:<run_id>]     (components in this fixed order, absent ones left out)

for example ``u:alice``, ``u:alice:r:s1``, ``a:planner``, ``u:alice:a:planner:r:s1``.

Each id is 1-38 characters of ``A-Z a-z 0-9 _ - . @``, not starting with ``.`` and without ``..``
(:data:`SCOPE_ID_PATTERN`): no ``:``, so the encoding is injective and :func:`decode` reads it
back exactly; three ids of the maximal length make a 122-character namespace, within memkern's
128 (:func:`memkern.base.paths.check_namespace` accepts every encoded scope). Namespaces that are not
encoded scopes (written by ``memkern ingest -n alice``, say) decode to ``None`` and are never
matched by a scope.

Reads that take a scope (search, list) match every scope that *contains* the given ids, as mem0
does: ``user_id=alice`` finds the memories of ``u:alice``, ``u:alice:r:s1`` and
``u:alice:a:planner``; ``user_id=alice, run_id=s1`` finds only ``u:alice:r:s1`` (and
``u:alice:a:*:r:s1``). Writes (add, respond) go to the exact scope given. Reads and writes of one
memory by id (get, update, delete, history) need a scope too, and reach only a memory of an
encoded scope that the given ids contain.

:class:`KeyRing` holds a server's API keys, each for any scope or bound to one.
"""
from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..errors import MemkernTypeError, MemkernValueError, bad_arg
from ..base.paths import check_namespace

#: One scope id: 1-38 characters of A-Z a-z 0-9 _ - . @, not starting with '.', no '..'.
SCOPE_ID_PATTERN = r"[A-Za-z0-9_@-][A-Za-z0-9_.@-]{0,37}"
_ID_RE = re.compile(SCOPE_ID_PATTERN)
#: The scope keys, in encoding order, with their namespace tags.
KEYS = (("user_id", "u"), ("agent_id", "a"), ("run_id", "r"))
_TAG_TO_KEY = {tag: key for key, tag in KEYS}
SCOPE_RULE = "1-38 characters of A-Z a-z 0-9 _ - . @, not starting with '.', without '..'"


@dataclass(frozen=True)
class Scope:
    """A user / agent / run combination (``None`` = not part of the scope)."""

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"user_id": self.user_id, "agent_id": self.agent_id, "run_id": self.run_id}

    @property
    def empty(self) -> bool:
        return self.user_id is None and self.agent_id is None and self.run_id is None

    def contains(self, other: "Scope") -> bool:
        """Whether every id given in ``self`` is equal in ``other`` (``self`` is a filter)."""
        return all(getattr(self, k) is None or getattr(self, k) == getattr(other, k) for k, _ in KEYS)


def check_scope_id(value: object, arg: str) -> str | None:
    """``value`` if it is ``None`` or a valid scope id (:data:`SCOPE_ID_PATTERN`), else a
    :class:`~memkern.MemkernValueError` (:class:`~memkern.MemkernTypeError` for a non-str)
    naming ``arg``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_arg(arg, f"a str of {SCOPE_RULE}", type(value).__name__, MemkernTypeError)
    if not _ID_RE.fullmatch(value) or ".." in value:
        raise bad_arg(arg, SCOPE_RULE, value)
    return value


def make_scope(user_id: object = None, agent_id: object = None, run_id: object = None, *,
               required: bool = True) -> Scope:
    """A validated :class:`Scope`; with ``required``, at least one id must be given."""
    scope = Scope(check_scope_id(user_id, "user_id"), check_scope_id(agent_id, "agent_id"),
                  check_scope_id(run_id, "run_id"))
    if required and scope.empty:
        raise MemkernValueError("user_id/agent_id/run_id: expected at least one of them, got none")
    return scope


def encode(scope: Scope) -> str:
    """The namespace of ``scope`` (see the module docstring); the scope must not be empty."""
    parts = []
    for key, tag in KEYS:
        v = check_scope_id(getattr(scope, key), key)
        if v is not None:
            parts.append(f"{tag}:{v}")
    if not parts:
        raise MemkernValueError("user_id/agent_id/run_id: expected at least one of them, got none")
    return check_namespace(":".join(parts), "scope")


def decode(namespace: str) -> Scope | None:
    """The scope a namespace encodes, or ``None`` when it is not an encoded scope."""
    parts = namespace.split(":")
    if len(parts) % 2 or not parts:
        return None
    ids: dict[str, str] = {}
    order = [tag for _, tag in KEYS]
    last = -1
    for tag, value in zip(parts[::2], parts[1::2]):
        if tag not in _TAG_TO_KEY or order.index(tag) <= last:
            return None
        last = order.index(tag)
        if not _ID_RE.fullmatch(value) or ".." in value:
            return None
        ids[_TAG_TO_KEY[tag]] = value
    return Scope(**ids)


def matching(namespaces: Iterable[str], scope: Scope) -> list[str]:
    """The namespaces among ``namespaces`` whose scope contains every id given in ``scope``."""
    out = []
    for ns in namespaces:
        s = decode(ns)
        if s is not None and scope.contains(s):
            out.append(ns)
    return out


class KeyRing:
    """The API keys a server accepts, each bound to a scope or to none (``None``: any scope).

    Parameters
    ----------
    keys : mapping of str to Scope or None
        Key text to its scope. A bound key's requests are held to its scope: every id it fixes
        is filled into a request that leaves it out, and a request that names another value gets
        403 (:class:`memkern.server.app.ScopeForbidden`).
    """

    def __init__(self, keys: Mapping[str, Scope | None]):
        if not isinstance(keys, Mapping) or not keys:
            raise bad_arg("api_keys", "a non-empty mapping of key to scope (or None)", keys)
        self._keys: list[tuple[bytes, Scope | None]] = []
        for k, scope in keys.items():
            if not isinstance(k, str) or not k.strip() or k != k.strip() or not k.isascii() or not k.isprintable():
                raise bad_arg("api_keys", "keys of printable ASCII without surrounding blanks", "an invalid key")
            if scope is not None and (not isinstance(scope, Scope) or scope.empty):
                raise bad_arg(f"api_keys[{k[:4]}...]", "a non-empty Scope or None", scope)
            if scope is not None:
                encode(scope)  # validates the ids
            self._keys.append((k.encode("ascii"), scope))

    @classmethod
    def parse(cls, text: str, source: str = "api key file") -> "KeyRing":
        """Keys from text, one a line: ``KEY`` (any scope) or ``KEY user_id=ID [agent_id=ID]
        [run_id=ID]`` (bound); blank lines and ``#`` comments are skipped."""
        keys: dict[str, Scope | None] = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, *fields = line.split()
            ids: dict[str, str] = {}
            for f in fields:
                name, eq, value = f.partition("=")
                if not eq or name not in ("user_id", "agent_id", "run_id") or name in ids:
                    raise bad_arg(f"{source} line {n}", "KEY [user_id=ID] [agent_id=ID] [run_id=ID]",
                                  f"a field {name!r}")
                ids[name] = value
            if key in keys:
                raise bad_arg(f"{source} line {n}", "each key once", "a repeated key")
            keys[key] = make_scope(**ids) if ids else None
        if not keys:
            raise bad_arg(source, "at least one key", "none")
        return cls(keys)

    def items(self) -> list[tuple[str, Scope | None]]:
        """``(key, scope)`` pairs, in the order given."""
        return [(k.decode("ascii"), s) for k, s in self._keys]

    def match(self, headers: Mapping[bytes, bytes]) -> tuple[bool, Scope | None]:
        """``(authorized, the key's scope)`` for a request's headers (``Authorization: Bearer
        <key>``, ``Authorization: Token <key>`` or ``X-API-Key: <key>``; every key compared, in
        constant time)."""
        offered = []
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            offered.append(auth[7:].strip())
        elif auth[:6].lower() == b"token ":  # mem0's SDK: "Authorization: Token <key>"
            offered.append(auth[6:].strip())
        key = headers.get(b"x-api-key")
        if key is not None:
            offered.append(key.strip())
        found, scope = False, None
        for got in offered:
            for want, s in self._keys:
                if hmac.compare_digest(got, want) and not found:
                    found, scope = True, s
        return found, scope
