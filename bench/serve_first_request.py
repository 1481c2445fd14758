"""First-request latency of ``memkern serve`` with the offline default embedder (MiniLM).

Starts the real command on a fresh store, waits until it says it is ready (``GET /health/ready``
200; a server without that route: ``GET /health`` 200), then times, one after the other, the first
add (``infer=false``, one message), ``--later`` more adds, the first search and ``--later`` more
searches. Prints JSON: seconds from start to ready and each latency, with the ratios first / median
of the later ones. ``--python`` runs another checkout's interpreter (its own memkern) for a
before / after comparison on one machine:

    python bench/serve_first_request.py                       # this checkout
    python bench/serve_first_request.py --python OTHER/.venv/bin/python
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

KEY = "bench-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(python: str = sys.executable, later: int = 5, timeout: float = 120.0) -> dict:
    """Start ``python -m memkern serve`` on a temporary store and time its first and later requests."""
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, MEMKERN_API_KEY=KEY, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.Popen([python, "-m", "memkern", "serve", "--store", os.path.join(tmp, "store"), "--port",
                                 str(port), "--log-level", "warning", "--threads", "1"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            live_s = ready_s = None
            saw_not_ready = False
            deadline = time.time() + timeout
            while ready_s is None:
                try:
                    r = httpx.get(url + "/health/ready", timeout=2)
                    if live_s is None:
                        live_s = time.perf_counter() - t0
                    if r.status_code in (401, 404):  # a server without readiness (unknown, so keyed): /health
                        r = httpx.get(url + "/health", timeout=2)
                    if r.status_code == 200:
                        ready_s = time.perf_counter() - t0
                    else:
                        saw_not_ready = True
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"server did not get ready: {proc.stderr.read() if proc.poll() is not None else ''}")
                time.sleep(0.05)
            headers = {"Authorization": f"Bearer {KEY}"}
            with httpx.Client(base_url=url, headers=headers, timeout=timeout) as http:
                def timed(path: str, body: dict) -> float:
                    s = time.perf_counter()
                    r = http.post(path, json=body)
                    took = time.perf_counter() - s
                    r.raise_for_status()
                    return took

                adds = [timed("/v1/memories", {"messages": f"I visited city number {i} on my trip last spring.",
                                               "user_id": "alice", "infer": False}) for i in range(later + 1)]
                searches = [timed("/v1/memories/search", {"query": f"Which city did I visit, number {i}?",
                                                          "user_id": "alice"}) for i in range(later + 1)]
        finally:
            proc.terminate()
            proc.wait(30)
    out = {"python": python, "live_s": live_s, "ready_s": ready_s, "saw_not_ready": saw_not_ready}
    for name, xs in (("add", adds), ("search", searches)):
        med = statistics.median(xs[1:])
        out[name] = {"first_s": xs[0], "later_median_s": med, "first_over_later": xs[0] / med}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable, help="interpreter whose memkern serves (default: this one)")
    p.add_argument("--later", type=int, default=5, help="later requests of each kind timed (default 5)")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.python, args.later), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
