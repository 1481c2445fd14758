"""The public import paths users write stay valid whatever the package's inner layout.

These are the names of ``memkern.__all__``, the modules the README and the docs send users to,
the ``memkern`` command and ``python -m memkern``. A module that moves inside the package keeps
these paths working (a face re-exports it); a path listed here never needs a change in user code.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TOP_LEVEL = [
    "MemoryStore", "Record", "InMemoryStore", "AsyncMemoryStore", "export_store", "import_store",
    "Reranker", "Selection", "ReinforceTrainer", "Embedder", "ChatModel", "OpenAIChatModel",
    "RMM", "RMMConfig", "MemReread", "ops", "rerank_scores", "data", "protocols",
    "MemkernError", "MemkernValueError", "MemkernTypeError", "MemkernKeyError",
    "StoreCorruptedError", "BackendUnavailableError", "MissingDependencyError", "__version__",
]

# module -> names that must be importable from it
PATHS = {
    "memkern.ops": ["rerank_scores", "gumbel_topm", "reinforce_grad", "rerank_step", "philox_uniform",
                    "resolve_backend", "RerankScores", "RerankForward", "GumbelTopM", "ReinforceGrad",
                    "RerankStep"],
    "memkern.graphs": ["GraphRunner"],
    "memkern.kernels": [],
    "memkern.kernels.rerank": [],
    "memkern.store": ["MemoryStore", "Record", "PAD_SCORE", "DEFAULT_EF_SEARCH", "MAX_K", "MAX_EF",
                      "MAX_CANDIDATES", "MAX_RESULTS", "MAX_NORM", "MAX_ALPHA", "MAX_FILTER_KEYS",
                      "MAX_FILTER_VALUES", "MAX_FILTER_STR", "MAX_QUERY_TEXT", "DEFAULT_RECENCY_WEIGHT",
                      "default_store_path", "check_search_filters", "turns_with_topics"],
    "memkern.store.prepare": ["prepare_add", "prepare_add_batch", "prepare_merge", "prepare_update",
                              "prepare_search", "check_search_filters"],
    "memkern.protocols": ["Embedder", "ChatModel", "Store", "TurnStore", "Extractor", "Decider"],
    "memkern.errors": ["MemkernError", "MemkernValueError", "MemkernTypeError", "MemkernKeyError",
                       "StoreCorruptedError", "BackendUnavailableError", "MissingDependencyError",
                       "bad_arg", "shown"],
    "memkern.data": [],
    "memkern.eval": [],
    "memkern.integrations.filters": [],
    "memkern.integrations.langgraph": ["MemkernStore", "encode_namespace", "decode_namespace", "parse_filter"],
    "memkern.integrations.langchain": ["MemkernVectorStore", "MemkernRetriever"],
    "memkern.integrations.llamaindex": ["MemkernVectorStore", "MemkernEmbedding"],
    "memkern.integrations.mem0": [],
    "memkern.server": [],
    "memkern.cli": ["main"],
}

MODELS_ALL = ["ChatModel", "Embedder", "OpenAIChatModel", "convert_gguf", "default_chat_gguf_path",
              "default_chat_model_path", "default_embedder_path", "default_tokenizer_path",
              "list_models", "model_cache_dir", "setup_default_models", "tiny_chat_model"]

DISTRIBUTED_ALL = ["ShardedStore", "shard_of", "ShardUnavailableError", "ingest", "IngestReport",
                   "run_jobs", "DataParallelTrainer"]


def test_top_level_names_resolve():
    import memkern

    for name in TOP_LEVEL:
        assert getattr(memkern, name) is not None, name
    assert set(TOP_LEVEL) <= set(memkern.__all__)
    assert memkern.ops is importlib.import_module("memkern.ops")
    assert memkern.MemoryStore is importlib.import_module("memkern.store").MemoryStore
    assert memkern.rerank_scores is importlib.import_module("memkern.ops").rerank_scores
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        memkern.nope  # noqa: B018


@pytest.mark.parametrize("module", sorted(PATHS))
def test_public_module_paths_import(module):
    mod = importlib.import_module(module)
    missing = [n for n in PATHS[module] if not hasattr(mod, n)]
    assert not missing, f"{module} lost {missing}"


def test_models_and_distributed_keep_their_names():
    models = importlib.import_module("memkern.models")
    assert set(MODELS_ALL) <= set(models.__all__)
    assert all(hasattr(models, n) for n in MODELS_ALL)
    distributed = importlib.import_module("memkern.distributed")
    assert set(DISTRIBUTED_ALL) <= set(distributed.__all__)


def test_the_command_entry_point_is_memkern_cli_main():
    conf = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert conf["project"]["scripts"]["memkern"] == "memkern.cli:main"
    from memkern.cli import main

    assert callable(main)


def test_python_dash_m_memkern_runs():
    import memkern

    out = subprocess.run([sys.executable, "-m", "memkern", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert memkern.__version__ in out.stdout


# 0.1 paths that moved in 0.2 (CHANGELOG.md) and the deprecated aliases that were removed
OLD_MODULES = ["memkern.validate", "memkern.atomic", "memkern.paths", "memkern.telemetry", "memkern.turns",
               "memkern.template", "memkern.timeexpr", "memkern.contradict", "memkern.jsonrepair",
               "memkern.extract", "memkern.update", "memkern.prompts", "memkern.inmemory", "memkern.aio",
               "memkern.bank", "memkern.transfer", "memkern.lexical", "memkern.reranker", "memkern.trainer",
               "memkern._reference", "memkern.rmm", "memkern.memreread", "memkern.commands",
               "memkern.models.lookup", "memkern.eval.memory"]
REMOVED_ALIASES = [("memkern.errors", "check_int"), ("memkern.models", "EmbedderLike"),
                   ("memkern.models", "ChatModelLike"), ("memkern.ops", "Rewards")]


@pytest.mark.parametrize("module", OLD_MODULES)
def test_moved_module_paths_are_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


@pytest.mark.parametrize("module, name", REMOVED_ALIASES)
def test_removed_aliases_raise_attribute_error(module, name):
    with pytest.raises(AttributeError, match=name):
        getattr(importlib.import_module(module), name)
