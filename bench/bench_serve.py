"""Load benchmark of ``memkern serve``: N concurrent clients doing add / search over HTTP.

The real command runs in its own process (``memkern serve --threads 1``, the offline default
MiniLM embedder, a fresh store preloaded through the API); the clients are tasks in this process
sharing one ``aiohttp`` session, each doing a mix of operations back to back:
``search`` (``POST /v1/memories/search``, limit 5), ``add_raw`` (``POST /v1/memories``,
``infer=false``: one message embedded and stored) and ``add_infer`` (``infer=true``: a two-turn
conversation through prospective reflection with the embedding extractor and decider).

Reported per operation and client count: p50 / p95 / p99 latency (client-side, request sent to
response parsed) and throughput (completed requests per second of the whole run). Correctness is
asserted: every acknowledged add is in the store afterwards (counted per scope through the API and
again in the store files once the server has stopped), and every search result belongs to the
searching user.

    .venv/bin/python bench/bench_serve.py --quick                     # ~1 min
    .venv/bin/python bench/bench_serve.py --clients 1,4,16 --requests 20 --repeats 3 --write-section
    .venv/bin/python bench/bench_serve.py --mix search --compare route --queries both \
        --clients 1,8,32,128 --requests 10 --repeats 3 --write-section   # the search curve, serve-search.md

Server CPU (cores: its CPU seconds per wall second) and the load generator's are reported per round.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

KEY = "bench-key"
MIX = (("search", 6), ("add_raw", 3), ("add_infer", 1))  # operation, weight (per 10 requests)
MIXES = {"default": MIX, "search": (("search", 1),)}

# mem0's published latency figures (their paper, arXiv:2504.19413, Table 2: LOCOMO, gpt-4o-mini,
# total = search + answer generation); see bench/sections/serve.md for what could and could not be verified.
MEM0_PUBLISHED = {"total_p95_s": 1.44, "source": "Mem0 paper (Chhikara et al., 2025, arXiv:2504.19413), Table 2"}

TOPICS = ["I moved to {city} last month.", "My sister {name} plays the cello.", "I work as a {job} now.",
          "I am training for a marathon in {city}.", "My dog {name} loves the beach.", "I stopped eating {food}.",
          "I am learning to cook {food} dishes.", "My favourite book is about {city}."]
FILL = {"city": ["Berlin", "Lisbon", "Osaka", "Quito", "Oslo", "Lyon"], "name": ["Mia", "Leo", "Ada", "Kai"],
        "job": ["nurse", "pilot", "baker", "teacher"], "food": ["meat", "sugar", "Thai", "Greek"]}


def _fact(i: int) -> str:
    t = TOPICS[i % len(TOPICS)]
    out = t
    for k, vals in FILL.items():
        out = out.replace("{" + k + "}", vals[(i // len(TOPICS) + len(k)) % len(vals)])
    return out + f" (note {i})"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(store: Path, port: int, embed_batch: int = 64, threads: int = 1, extra: tuple = ()) -> subprocess.Popen:
    import httpx

    env = dict(os.environ, MEMKERN_API_KEY=KEY, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-m", "memkern", "serve", "--store", str(store), "--port", str(port),
                             "--threads", str(threads), "--log-level", "warning", "--embed-batch", str(embed_batch), *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"memkern serve did not start: {proc.stderr.read()}")
        time.sleep(0.2)


async def run_load(url: str, clients: int, requests: int, users: int, seed: int, mix=MIX,
                   distinct: bool = False) -> dict:
    """``clients`` tasks, each doing ``requests`` operations of ``mix``; returns latencies,
    the adds acknowledged per user and the wall time.

    The clients share one aiohttp session (``clients`` keep-alive connections): httpx's async pool
    costs about a core of client CPU at 32 clients on these machines, so the load generator, not the
    server, set the pace."""
    import aiohttp

    lat: dict[str, list[float]] = {op: [] for op, _ in mix}
    acked: dict[str, int] = {}
    cycle = [op for op, w in mix for _ in range(w)]
    errors: list[str] = []

    async def client(c: int, http: "aiohttp.ClientSession"):
        for r in range(requests):
            op = cycle[(r + 3 * c + seed) % len(cycle)]
            user = f"user{(c * 7 + r) % users}"
            i = c * 100_000 + r
            if op == "search":
                text = _fact(i + 1).split(" (")[0] + (f" ({seed}.{i})?" if distinct else "?")
                body = {"query": text, "user_id": user, "limit": 5}
                path = "/v1/memories/search"
            elif op == "add_raw":
                body = {"messages": _fact(i), "user_id": user, "infer": False}
                path = "/v1/memories"
            else:
                body = {"messages": [{"role": "user", "content": _fact(i) + " It changed a lot for me."},
                                     {"role": "assistant", "content": "Thanks for telling me."}],
                        "user_id": user}
                path = "/v1/memories"
            t0 = time.perf_counter()
            async with http.post(url + path, json=body) as resp:
                out = await resp.json()
                status = resp.status
            dt = time.perf_counter() - t0
            if status != 200:
                errors.append(f"{op}: {status} {out}")
                continue
            lat[op].append(dt)
            if op == "search":
                bad = [x for x in out["results"] if x["user_id"] != user]
                if bad:
                    errors.append(f"search of {user} returned other users' memories: {bad[:1]}")
            else:
                new = sum(1 for x in out["results"] if x["event"] in ("ADD", "INVALIDATE"))
                acked[user] = acked.get(user, 0) + new

    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(headers={"X-API-Key": KEY}, connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        wall = time.perf_counter() - t0
    if errors:
        raise AssertionError(f"{len(errors)} failed requests, first: {errors[0]}")
    return {"latency_s": lat, "acked": acked, "wall_s": wall}


def preload(url: str, users: int, per_user: int) -> dict[str, int]:
    import httpx

    counts = {}
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=300) as http:
        for u in range(users):
            user = f"user{u}"
            msgs = [{"role": "user", "content": _fact(u * 1000 + j)} for j in range(per_user)]
            for s in range(0, per_user, 64):
                r = http.post("/v1/memories", json={"messages": msgs[s:s + 64], "user_id": user, "infer": False})
                r.raise_for_status()
            counts[user] = per_user
    return counts


def count_via_api(url: str, users: int) -> dict[str, int]:
    import httpx

    out = {}
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=300) as http:
        for u in range(users):
            r = http.get("/v1/memories", params={"user_id": f"user{u}", "limit": 1000})
            r.raise_for_status()
            out[f"user{u}"] = len(r.json()["results"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,4,16", help="comma-separated concurrent client counts")
    ap.add_argument("--requests", type=int, default=30, help="requests per client per round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per client count and server (interleaved)")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--preload", type=int, default=100, help="memories per user stored before the load")
    ap.add_argument("--quick", action="store_true", help="--clients 1,4 --requests 10 --preload 20")
    ap.add_argument("--mix", choices=sorted(MIXES), default="default",
                    help="default: 6 search, 3 add infer=false, 1 add infer=true per 10 requests; search: search only")
    ap.add_argument("--threads", type=int, default=1, help="the server's --threads (CPU threads of the models)")
    ap.add_argument("--queries", choices=("repeated", "distinct", "both"), default="repeated",
                    help="repeated: search texts recur across clients, as an agent's recurring questions do; "
                         "distinct: every text is new (no query-cache hits); both: each client count with both")
    ap.add_argument("--compare", choices=("embed-batch", "route"), default="embed-batch",
                    help="the second server: --embed-batch 1 (embed-batch), or the eager-torch embedder without "
                         "a query cache (route)")
    ap.add_argument("--no-compare", dest="embed_batch_compare", action="store_false",
                    help="only the default server (else also one with --embed-batch 1, interleaved, for the ratio)")
    ap.add_argument("--write-section", action="store_true", help="refresh bench/sections/serve.md")
    ap.add_argument("--json", default=str(HERE / "results" / "serve.json"))
    args = ap.parse_args(argv)
    if args.write_section and (args.mix, args.compare) not in (("default", "embed-batch"), ("search", "route")):
        ap.error("--write-section: expected --mix default --compare embed-batch (serve.md) or --mix search "
                 f"--compare route (serve-search.md), got --mix {args.mix} --compare {args.compare}")
    if args.write_section and not args.embed_batch_compare:
        ap.error("--write-section: expected the second server for the ratio, got --no-compare")
    if args.quick:
        args.clients, args.requests, args.preload, args.repeats = "1,4", 10, 20, 1
    client_counts = [int(x) for x in args.clients.split(",")]
    mix = MIXES[args.mix]

    import harness

    machine = harness.machine_info()
    second = ({"one-at-a-time": (1, ())} if args.compare == "embed-batch" else
              {"torch, no cache": (64, ("--embedder-backend", "torch", "--query-cache", "0"))})
    configs = {"batched": (64, ()), **(second if args.embed_batch_compare else {})}
    # admission (--max-concurrent, default 64) would shed clients beyond it with 503s
    admit = ("--max-concurrent", str(max(64, max(client_counts))))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        servers = {}
        try:
            for name, (eb, extra) in configs.items():
                port = _free_port()
                url = f"http://127.0.0.1:{port}"
                store = Path(tmp) / name
                servers[name] = {"proc": start_server(store, port, eb, args.threads, extra + admit), "url": url, "store": store, "embed_batch": eb}
            for name, sv in servers.items():
                t0 = time.perf_counter()
                preload(sv["url"], args.users, args.preload)
                sv["preload_s"] = time.perf_counter() - t0
                asyncio.run(run_load(sv["url"], 1, 4, args.users, seed=99))  # warm-up (model paths, allocators)
                sv["expected"] = count_via_api(sv["url"], args.users)
            import statistics

            kinds = ["repeated", "distinct"] if args.queries == "both" else [args.queries]
            for k, (kind, n) in enumerate((kind, n) for kind in kinds for n in client_counts):
                pooled = {name: {op: [] for op, _ in mix} for name in servers}
                rps = {name: [] for name in servers}
                cores = {name: [] for name in servers}
                client_cores = {name: [] for name in servers}
                for rep in range(args.repeats):
                    # interleaved: the order alternates, so neither side always runs first
                    order = list(servers) if (k + rep) % 2 == 0 else list(servers)[::-1]
                    for name in order:
                        sv = servers[name]
                        c0, p0 = cpu_seconds(sv["proc"].pid), time.process_time()
                        res = asyncio.run(run_load(sv["url"], n, args.requests, args.users, seed=n + 1000 * rep,
                                                   mix=mix, distinct=kind == "distinct"))
                        cores[name].append((cpu_seconds(sv["proc"].pid) - c0) / res["wall_s"])
                        client_cores[name].append((time.process_time() - p0) / res["wall_s"])
                        for u, c in res["acked"].items():
                            sv["expected"][u] += c
                        got = count_via_api(sv["url"], args.users)
                        assert got == sv["expected"], f"{name}: acknowledged adds missing after {n} clients: {got}"
                        for op, xs in res["latency_s"].items():
                            pooled[name][op] += xs
                        rps[name].append(sum(len(v) for v in res["latency_s"].values()) / res["wall_s"])
                for name, sv in servers.items():
                    row = {"config": name, "embed_batch": sv["embed_batch"], "queries": kind, "clients": n,
                           "repeats": args.repeats,
                           "requests": sum(len(v) for v in pooled[name].values()),
                           "throughput_rps": statistics.median(rps[name]), "throughput_runs": rps[name],
                           "server_cores": statistics.median(cores[name]),
                           "client_cores": statistics.median(client_cores[name])}
                    for op, xs in pooled[name].items():
                        row[op] = {"n": len(xs), "p50_ms": 1e3 * _pct(xs, 50), "p95_ms": 1e3 * _pct(xs, 95),
                                   "p99_ms": 1e3 * _pct(xs, 99)}
                    rows.append(row)
                    print(f"{name:>15} {kind} queries, clients {n:>3}: {row['requests']} requests, median {row['throughput_rps']:.1f} req/s "
                          f"(runs {', '.join(f'{x:.1f}' for x in rps[name])}), server {row['server_cores']:.2f} cores, "
                          f"clients {row['client_cores']:.2f} cores; "
                          + "; ".join(f"{op} p50 {row[op]['p50_ms']:.0f} / p95 {row[op]['p95_ms']:.0f} / "
                                      f"p99 {row[op]['p99_ms']:.0f} ms" for op, _ in mix), flush=True)
        finally:
            for sv in servers.values():
                sv["proc"].terminate()
            for sv in servers.values():
                sv["proc"].wait(60)
        from memkern import MemoryStore

        for name, sv in servers.items():
            with MemoryStore(sv["store"]) as st:  # the files hold every acknowledged add
                on_disk = {f"user{u}": st.count(f"u:user{u}") for u in range(args.users)}
            assert on_disk == sv["expected"], f"{name}: store files after shutdown: {on_disk} != {sv['expected']}"
            print(f"{name}: verified {sum(on_disk.values())} acknowledged memories in the store after shutdown")
    preload_s = {name: sv["preload_s"] for name, sv in servers.items()}
    result = {"machine": machine, "args": vars(args), "preload_s": preload_s, "rows": rows, "mem0": MEM0_PUBLISHED}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    if args.write_section:
        command = " ".join(["bench/bench_serve.py"] + (argv if argv is not None else sys.argv[1:]))
        (write_search_section if args.mix == "search" else write_section)(result, command)
    return 0


def write_search_section(result: dict, command: str) -> None:
    """``bench/sections/serve-search.md``: search-only load, the default server (ONNX Runtime query
    embedding, query cache, batching) against the eager-torch embedder without a cache, per client count."""
    import report

    a = result["args"]
    rows = result["rows"]
    L = [f"`memkern serve` (uvicorn, one process, `--threads {a['threads']}`, offline MiniLM embedder on CPU) over a "
         f"store preloaded with {a['preload']} memories for each of {a['users']} users; only `search` requests "
         f"(`POST /v1/memories/search`, limit 5) from concurrent clients (tasks sharing one aiohttp session in "
         f"another process, {a['requests']} requests each, back to back). Every search result was checked to "
         f"belong to the searching user. Queries: *repeated* texts recur across clients (an agent's recurring "
         f"questions: the query cache answers most), *distinct* texts are all new (every one is embedded).", "",
         "Two servers on identical stores, run interleaved (the order alternates): the default "
         "(`--embedder-backend auto`: ONNX Runtime when installed, query cache of "
         "4,096 texts, batched embedding) and `--embedder-backend torch --query-cache 0` (eager torch, every "
         f"query embedded). Each client count ran {a['repeats']} time(s) per server; req/s is the median of "
         "the rounds, latency percentiles pool them; server cores = the server's CPU seconds per second of wall "
         "time, client cores the load generator's.", "",
         "| queries | server | clients | req/s | p50 / p95 / p99 (ms) | server cores | client cores |",
         "|---|---|---|---|---|---|---|"]
    label = {"batched": "default", "torch, no cache": "torch, no cache"}
    for r in sorted(rows, key=lambda r: (r["queries"] != "repeated", r["clients"], r["config"] != "batched")):
        s = r["search"]
        L.append(f"| {r['queries']} | {label[r['config']]} | {r['clients']} | {r['throughput_rps']:.1f} | "
                 f"{s['p50_ms']:.0f} / {s['p95_ms']:.0f} / {s['p99_ms']:.0f} | {r['server_cores']:.2f} | "
                 f"{r['client_cores']:.2f} |")
    by = {(r["queries"], r["config"], r["clients"]): r for r in rows}
    ratio_txt, headline = [], []
    for (kind, cfg, n), r in sorted(by.items()):
        base = by.get((kind, "torch, no cache", n))
        if cfg != "batched" or base is None:
            continue
        x = r["throughput_rps"] / base["throughput_rps"]
        ratio_txt.append(f"{kind} {n} clients {x:.2f}x")
        if n == 32:
            headline.append([f"search, 32 clients, {kind} queries", f"{r['throughput_rps']:.1f} req/s",
                             f"torch, no cache {base['throughput_rps']:.1f} req/s", f"{x:.2f}x"])
    if ratio_txt:
        L += ["", "Throughput of the default server over the eager-torch, uncached one: " + ", ".join(ratio_txt) + "."]
    report.write_section("serve-search", "memkern serve: search under load (1 to 128 clients)", "\n".join(L),
                         command, machine=result["machine"], raw_json="bench/results/serve.json",
                         headline=headline or None)


def write_section(result: dict, command: str) -> None:
    import report

    a = result["args"]
    L = [f"`memkern serve` (uvicorn, one process, `--threads 1`, offline MiniLM embedder on CPU) over a store "
         f"preloaded with {a['preload']} memories for each of {a['users']} users; clients are concurrent "
         f"tasks sharing one aiohttp session in another process, each sending {a['requests']} requests back to back "
         f"(mix per 10 requests: 6 `search` limit 5, 3 `add` with `infer=false` (one message), 1 `add` with "
         f"`infer=true` (two turns through prospective reflection)). Latency is client-side; throughput is "
         f"completed requests per second of wall time. Every acknowledged add was verified present through "
         f"the API after each round and in the store files after shutdown; every search result belonged to "
         f"the searching user.", "",
         "Two servers run side by side on identical stores: the default, whose embedder batches the texts of "
         "concurrent requests (`--embed-batch 64`), and one embedding each request on its own "
         f"(`--embed-batch 1`); each client count is run {a['repeats']} times on both, interleaved (the order "
         "alternates), so the ratio is measured under the same machine load. req/s is the median of the "
         "rounds (each round's value in the raw JSON); latency percentiles pool the rounds' requests.", "",
         "| server | clients | req/s | search p50 / p95 / p99 (ms) | add (infer=false) p50 / p95 / p99 (ms) | "
         "add (infer=true) p50 / p95 / p99 (ms) |", "|---|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: (r["clients"], r["embed_batch"] == 1)):
        cells = [f"{r[op]['p50_ms']:.0f} / {r[op]['p95_ms']:.0f} / {r[op]['p99_ms']:.0f}" for op, _ in MIX]
        L.append(f"| `--embed-batch {r['embed_batch']}` | {r['clients']} | {r['throughput_rps']:.1f} | "
                 + " | ".join(cells) + " |")
    by = {(r["config"], r["clients"]): r for r in result["rows"]}
    ratios = [f"{n} clients {by[('batched', n)]['throughput_rps'] / by[('one-at-a-time', n)]['throughput_rps']:.2f}x"
              for n in sorted({r["clients"] for r in result["rows"]}) if ("one-at-a-time", n) in by]
    if ratios:
        L += ["", "Throughput of the batching embedder over one request at a time: " + ", ".join(ratios) + "."]
    body = "\n".join(L) + "\n\n" + MEM0_NOTE
    report.write_section("serve", "memkern serve under load (concurrent HTTP clients)", body, command,
                         machine=result["machine"], raw_json="bench/results/serve.json")


MEM0_NOTE = """**Next to mem0's published figures.** The Mem0 paper (Chhikara et al., 2025, arXiv:2504.19413,
Table 2; also summarised on mem0.ai/research as "91% lower p95 latency" than full context) reports a
p95 *total* latency of 1.44 s per question on LOCOMO (memory search plus answer generation with
gpt-4o-mini, hosted embeddings and a hosted vector store), against 17.12 s for full context. The
paper's separate p50/p95 *search* latencies could not be verified from the sources available to this
session, so they are not quoted here. The figures are not like for like: mem0's are single-request
latencies over network services with an LLM call; the table above is memkern's whole HTTP round
trip on 2 shared CPU cores with a local embedder, under concurrent load, and involves no LLM. mem0's
own `add` calls an LLM for fact extraction (users report 4-12 s per add, mem0 issue #3097, quoted in
memkern's issue 14); memkern's `infer=true` add uses the LLM-free embedding extractor."""


if __name__ == "__main__":
    sys.exit(main())
