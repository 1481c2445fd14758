"""memkern.base.validate: the one module of argument checks (messages, error classes, numpy and bool
handling), and that the modules that used hand-written checks keep their exact messages."""
from __future__ import annotations

import math

import numpy as np
import pytest

from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.base.validate import check_choice, check_float, check_int, check_str, is_int, is_real


def test_check_int_bounds_messages_and_types():
    assert check_int("n", 3, 1) == 3 and type(check_int("n", np.int64(3), 1)) is int
    assert check_int("n", None, 1, none_ok=True) is None
    with pytest.raises(MemkernValueError, match=r"^n: expected an int >= 1, got 0$"):
        check_int("n", 0, 1)
    with pytest.raises(MemkernValueError, match=r"^n: expected an int >= 1, got True$"):
        check_int("n", True, 1)  # a bool is not an int here
    with pytest.raises(MemkernValueError, match=r"^n: expected an int in 1\.\.5, got 2\.0$"):
        check_int("n", 2.0, 1, 5)
    with pytest.raises(MemkernValueError, match=r"^n: expected an int >= 1 or None, got 0$"):
        check_int("n", 0, 1, none_ok=True)
    with pytest.raises(MemkernValueError, match=r"^n: expected a positive int, got -2$"):
        check_int("n", -2, 1, expected="a positive int")
    # The store's convention: a non-int is a TypeError naming its type; a range error a ValueError.
    with pytest.raises(MemkernTypeError, match=r"^k: expected an int in 1\.\.10, got 'str'$"):
        check_int("k", "3", 1, 10, type_error=True)
    with pytest.raises(MemkernValueError, match=r"^k: expected an int in 1\.\.10, got 11$"):
        check_int("k", np.int32(11), 1, 10, type_error=True)

    class Custom(MemkernValueError):
        pass

    with pytest.raises(Custom, match="limit"):
        check_int("limit", 0, 1, error=Custom)


def test_check_float_bounds_nan_inf():
    assert check_float("x", np.float32(0.5), 0, 1) == 0.5 and type(check_float("x", 1, 0)) is float
    for bad in (math.nan, "0.5", None, True):
        with pytest.raises(MemkernValueError, match="^x: "):
            check_float("x", bad, 0, 1)
    assert check_float("x", math.inf, 0) == math.inf
    with pytest.raises(MemkernValueError, match=r"^x: expected a finite float >= 0, got inf$"):
        check_float("x", math.inf, 0, finite=True)
    with pytest.raises(MemkernValueError, match=r"^x: expected a float in \(0, 1\], got 0$"):
        check_float("x", 0, 0, 1, low_open=True)
    with pytest.raises(MemkernValueError, match=r"^x: expected a float in \[0, 1\), got 1\.0$"):
        check_float("x", 1.0, 0, 1, high_open=True)
    assert check_float("x", None, 0, none_ok=True) is None
    with pytest.raises(MemkernValueError, match=r"^x: expected a float, got nan$"):
        check_float("x", math.nan)  # NaN fails even without bounds


def test_check_choice_and_str():
    assert check_choice("mode", "a", ("a", "b")) == "a"
    assert check_choice("q", None, (None, "int8")) is None
    with pytest.raises(MemkernValueError, match=r"^mode: expected 'a', 'b' or 'c', got 'd'$"):
        check_choice("mode", "d", ("a", "b", "c"))
    with pytest.raises(MemkernValueError, match="mode"):
        check_choice("mode", np.array(["a"]), ("a", "b"))  # an array is not one of the names
    with pytest.raises(MemkernValueError, match=r"^query: expected a non-empty str, got '  '$"):
        check_str("query", "  ", nonempty=True)
    with pytest.raises(MemkernTypeError, match=r"^s: expected a str, got 'int'$"):
        check_str("s", 3, type_error=True)
    assert is_int(np.uint8(1)) and not is_int(np.bool_(True)) and is_real(np.float16(1)) and not is_real(False)


@pytest.mark.parametrize("build, message", [
    # The messages the hand-written checks gave, kept word for word through memkern.base.validate.
    (lambda: __import__("memkern.score.reranker", fromlist=["Reranker"]).Reranker(0), "dim: expected a positive int, got 0"),
    (lambda: __import__("memkern.score.reranker", fromlist=["Reranker"]).Reranker(8, tau=0.0), "tau: expected a positive float, got 0.0"),
    (lambda: __import__("memkern.score.reranker", fromlist=["Reranker"]).Reranker(8, backend="cuda"),
     "backend: expected 'auto', 'triton', 'torch' or 'native', got 'cuda'"),
    (lambda: __import__("memkern.score.trainer", fromlist=["x"]).ReinforceTrainer(
        __import__("memkern.score.reranker", fromlist=["Reranker"]).Reranker(8), baseline_momentum=1.0),
     "baseline_momentum: expected a float in [0, 1), got 1.0"),
    (lambda: __import__("memkern.score.trainer", fromlist=["x"]).ReinforceTrainer(
        __import__("memkern.score.reranker", fromlist=["Reranker"]).Reranker(8), replay_size=-1),
     "replay_size: expected None or an int >= 0, got -1"),
    (lambda: __import__("memkern.models", fromlist=["x"]).OpenAIChatModel("http://x/v1", "m", retries=-1),
     "retries: expected an int >= 0, got -1"),
    (lambda: __import__("memkern.models", fromlist=["x"]).OpenAIChatModel("http://x/v1", "m", timeout=math.nan),
     "timeout: expected a positive number of seconds, got nan"),
    (lambda: __import__("memkern.models", fromlist=["x"]).OpenAIChatModel("http://x/v1", "m", concurrency=0),
     "concurrency: expected a positive int, got 0"),
    (lambda: __import__("memkern.store", fromlist=["x"]).MemoryStore(path=None, dim=0), "dim: expected an int in 1..65536, got 0"),
])
def test_callers_keep_their_messages(build, message):
    with pytest.raises(MemkernValueError) as e:
        build()
    assert str(e.value) == message
