"""A chat model behind an OpenAI-compatible HTTP endpoint (:class:`OpenAIChatModel`), standard
library only."""
from __future__ import annotations

import concurrent.futures
import json as _json
import logging
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from ..errors import BackendUnavailableError, MemkernTypeError, bad_arg
from ..base.validate import check_float, check_int
from ..base.telemetry import traced
from .chat import Prompt, _check_gen_args, _check_prompts, _json_kind, _trim_json

log = logging.getLogger("memkern")

__all__ = ["OpenAIChatModel"]


class OpenAIChatModel:
    """Chat model served over an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM,
    llama.cpp server, TGI, ...), with the same ``generate`` API as :class:`ChatModel`.

    Requests use the standard library (``urllib``); a batch is sent as concurrent requests from a
    small thread pool (servers batch them on their side).

    Parameters
    ----------
    base_url : server root including the API version, e.g. ``"http://127.0.0.1:8000/v1"``;
        requests go to ``base_url + "/chat/completions"``.
    model : model name the server expects.
    api_key : sent as ``Authorization: Bearer``; default ``$OPENAI_API_KEY`` if set, else none.
    timeout : seconds per request.
    max_new_tokens : default ``max_tokens``.
    concurrency : parallel requests.
    retries : extra attempts on connection errors and HTTP 429/5xx (exponential back-off).
    json_response_format : with ``json=True`` also ask the server for
        ``response_format={"type": "json_object"}`` (the reply is trimmed to its first JSON object
        either way).
    context_length : the served model's context (tokens), used by callers to size prompts.
    chars_per_token : :meth:`count_tokens` is an APPROXIMATION, ``ceil(len(text) / chars_per_token)``
        (about 4 characters per token for English BPE vocabularies), since the server's tokenizer
        is not available locally. Pass ``tokenizer`` (a transformers tokenizer or folder) for exact
        counts.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 60,
                 max_new_tokens: int = 256, concurrency: int = 4, retries: int = 2,
                 json_response_format: bool = True, context_length: int = 8192,
                 chars_per_token: float = 4.0, tokenizer: Any = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise bad_arg("base_url", "an http(s) URL such as 'http://127.0.0.1:8000/v1'", base_url)
        if not isinstance(model, str) or not model:
            raise bad_arg("model", "a non-empty model name", model)
        check_float("timeout", timeout, 0, low_open=True, expected="a positive number of seconds")
        self.base_url = base_url.rstrip("/")
        self.model_name = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = float(timeout)
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, expected="a positive int")
        self.concurrency = check_int("concurrency", concurrency, 1, expected="a positive int")
        retries = check_int("retries", retries, 0)
        self.retries = retries
        self.json_response_format = bool(json_response_format)
        self.context_length = check_int("context_length", context_length, 1, expected="a positive int")
        check_float("chars_per_token", chars_per_token, 0, low_open=True, expected="a positive number")
        self.chars_per_token = float(chars_per_token)
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        self.tokenizer = tokenizer
        self.last_usage: list[tuple[int, int]] = []
        log.info("OpenAIChatModel: %s at %s (concurrency %d)", model, self.base_url, self.concurrency)

    def count_tokens(self, text: str) -> int:
        """Token count: exact with ``tokenizer``, else ``ceil(len(text) / chars_per_token)``."""
        if not isinstance(text, str):
            raise bad_arg("text", "str", type(text).__name__, MemkernTypeError)
        if self.tokenizer is not None:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return int(math.ceil(len(text) / self.chars_per_token))

    def _post(self, payload: dict) -> dict:
        url = self.base_url + "/chat/completions"
        data = _json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.25 * 2 ** (attempt - 1), 4.0))
            req = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return _json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as e:
                body = e.read().decode("utf-8", "replace")[:300]
                last = BackendUnavailableError(f"{url}: HTTP {e.code} {e.reason}: {body}")
                if e.code != 429 and e.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = BackendUnavailableError(f"{url}: request failed: {e}")
            except ValueError as e:
                raise BackendUnavailableError(f"{url}: reply is not JSON: {e}") from e
        assert last is not None
        raise last

    def _one(self, messages: list[dict], max_new_tokens: int, kind: str | None, temperature: float,
             seed: int | None) -> tuple[str, int, int]:
        payload: dict[str, Any] = {"model": self.model_name, "messages": messages,
                                   "max_tokens": max_new_tokens, "temperature": temperature}
        if seed is not None:
            payload["seed"] = int(seed)
        if kind == "object" and self.json_response_format:
            payload["response_format"] = {"type": "json_object"}
        reply = self._post(payload)
        try:
            text = reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as e:
            raise BackendUnavailableError(f"{self.base_url}: unexpected reply shape: {str(reply)[:300]}") from e
        u = reply.get("usage") or {}
        p = int(u.get("prompt_tokens") or sum(self.count_tokens(m["content"]) for m in messages))
        o = int(u.get("completion_tokens") or self.count_tokens(text))
        return _trim_json(text, kind).strip(), p, o

    @traced("memkern.chat.generate", args=("prompts", "max_new_tokens"))
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int | None = None, json: Any = False,
                 temperature: float = 0.0, seed: int | None = None) -> list[str]:
        """Same contract as :meth:`ChatModel.generate`; requests run concurrently."""
        chats = _check_prompts(prompts)
        _check_gen_args(max_new_tokens, temperature)
        kind = _json_kind(json)
        mnt = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if not chats:
            self.last_usage = []
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.concurrency, len(chats))) as pool:
            futs = [pool.submit(self._one, c, mnt, kind, float(temperature), seed) for c in chats]
            res = [f.result() for f in futs]
        self.last_usage = [(p, o) for _, p, o in res]
        return [t for t, _, _ in res]

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model_name!r})"
