"""LangChain's own standard vector-store suite (``langchain_tests``, the package LangChain asks
integrations to pass) against ``MemkernVectorStore``, on both modes of the store engine (on disk and
persistence off): add / get / delete (missing ids included) / idempotent upserts, sync and async."""
from __future__ import annotations

import pytest

pytest.importorskip("langchain_tests")
pytest.importorskip("pytest_asyncio")     # runs the suite's async half

from langchain_tests.integration_tests import VectorStoreIntegrationTests  # noqa: E402

from memkern.integrations.langchain import MemkernVectorStore  # noqa: E402


class TestMemkernVectorStoreStandard(VectorStoreIntegrationTests):
    # The suite's async tests are bare coroutines (LangChain runs them in pytest-asyncio's auto mode);
    # the mark runs them in strict mode, and pytest-asyncio's note that it also lands on the sync
    # ones is silenced. (Overriding a suite test is refused by its test_no_overrides_DO_NOT_OVERRIDE.)
    pytestmark = [pytest.mark.asyncio,
                  pytest.mark.filterwarnings("ignore:.*marked with '@pytest.mark.asyncio' but it is not an async")]

    @pytest.fixture()
    def vectorstore(self, make_store):
        vs = MemkernVectorStore(make_store(6), self.get_embeddings(), namespace="standard")
        try:
            yield vs
        finally:
            vs.close()


#: The suite's tests (each but test_no_overrides_DO_NOT_OVERRIDE runs once per store kind; tests a
#: newer langchain-tests adds run too, inherited).
SUITE_TESTS = sorted(n for n in dir(VectorStoreIntegrationTests) if n.startswith("test_"))


def test_the_whole_suite_is_collected():
    # langchain-tests 1.1.9 has 25; fewer means the suite changed shape and this file needs a look
    assert len(SUITE_TESTS) >= 25, SUITE_TESTS
    assert {"test_delete_missing_content", "test_delete_missing_content_async"} <= set(SUITE_TESTS)
