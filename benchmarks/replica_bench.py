"""Data-parallel replicas: cache-aware vs least-loaded vs round-robin routing on a multi-turn
workload, in the same run.

    .venv/bin/python benchmarks/replica_bench.py                   # 2 and 4 replicas
    # the working set fits the two replicas' caches together but not one's (docs/disaggregation.md):
    .venv/bin/python benchmarks/replica_bench.py --replicas 2 --conversations 12 --rate 0.25 \
        --system-words 30 --doc-words 150 --user-words 15 --max-tokens 16 --think-s 2 \
        --serve-args "--num-kv-blocks 64" --out /tmp/replicas
    .venv/bin/cadence sim --calibrate --threads 1 --compare /tmp/replicas/results.json

Per replica count: `cadence serve --data-parallel-size N --routing-policy cache-aware` (N
`--role both` replicas with an equal share of the cores, and its router), then two more
`cadence router --worker ...` over the same replicas (least-loaded, round-robin). Each policy
gets the same workload (same seed) with its texts tagged by the policy's name, so no run
finds another's prefixes cached. Workload: conversations of 4-8 turns (uniform), each opening
with one of a few shared system prompts; conversations start as Poisson arrivals, each next
turn is sent after the answer plus an exponential think time (--think-s), and carries the
whole chat so far (answers included); --doc-words adds a document of its own to each
conversation's first turn (RAG), and --serve-args "--num-kv-blocks N" sizes the replicas'
caches. Printed per policy: prefix-cache hit rate (cached prompt tokens / prompt tokens over
all requests, from each request's usage as its replica reported it; the engines' counters,
which count a preempted request's readmission again, next to it), TTFT p50/p99, goodput
(requests per second that finished with TTFT <= --slo-ttft), requests per replica; results
(with every request's record, which `cadence sim --compare` replays) in --out as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

WORDS = ("the model reads each token of the prompt and writes keys and values into blocks of "
         "its cache while the scheduler packs prefill chunks next to decode steps under a "
         "budget so that streams keep flowing and long documents do not stall them").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log_path: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "cadence.cli", *args, "--port", str(port),
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} exited; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"not ready; see {log_path}")


def prefix_counters(urls: list[str]) -> tuple[float, float, float]:
    """(hits, queries, preemptions) of the replicas' engines, summed."""
    hits = queries = preemptions = 0.0
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(url + "/metrics",
                                                               timeout=10).text):
            for s in family.samples:
                if s.name == "cadence:prefix_cache_hits_total":
                    hits += s.value
                elif s.name == "cadence:prefix_cache_queries_total":
                    queries += s.value
                elif s.name == "cadence:num_preemptions_total":
                    preemptions += s.value
    return hits, queries, preemptions


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def workload(seed: int, tag: str, num_conversations: int, num_systems: int,
             system_words: int, user_words: int, rate: float,
             doc_words: int = 0, think_s: float = 0.3) -> list[dict]:
    rng = random.Random(seed)
    systems = [f"[{tag}] You are assistant {i}. " + words(rng, system_words)
               for i in range(num_systems)]
    out, t = [], 0.0
    for c in range(num_conversations):
        t += rng.expovariate(rate)
        system = rng.randrange(num_systems)
        out.append({"start": t, "system": systems[system], "system_index": system,
                    "users": [(f"Document {c}: " + words(rng, doc_words) + "\n" if k == 0
                               and doc_words else "") + f"Question {c}.{k}: "
                              + words(rng, user_words) for k in range(rng.randint(4, 8))],
                    "think": [rng.expovariate(1 / think_s) for _ in range(8)]})
    return out


async def one_turn(client: httpx.AsyncClient, url: str, messages: list[dict],
                   max_tokens: int) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, text, error, usage = None, [], None, {}
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                continue
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(piece)
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft": ttft, "text": "".join(text), "error": error, "sent": start,
            "e2e": time.perf_counter() - start, "prompt_tokens": usage.get("prompt_tokens", 0),
            "cached_tokens": details.get("cached_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0)}


async def conversation(client, url, conv, max_tokens, t0, records, index) -> None:
    await asyncio.sleep(max(0.0, conv["start"] - (time.perf_counter() - t0)))
    messages = [{"role": "system", "content": conv["system"]}]
    for k, user in enumerate(conv["users"]):
        messages.append({"role": "user", "content": user})
        rec = await one_turn(client, url, messages, max_tokens)
        rec.update(conversation=index, turn=k, system=conv["system_index"],
                   sent=rec["sent"] - t0, think=conv["think"][k])
        records.append(rec)
        messages.append({"role": "assistant", "content": rec["text"]})
        await asyncio.sleep(conv["think"][k])


async def run_workload(url: str, convs: list[dict], max_tokens: int) -> tuple[list, float]:
    records: list[dict] = []
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(conversation(client, url, c, max_tokens, t0, records, i)
                               for i, c in enumerate(convs)))
        return records, time.perf_counter() - t0


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def decisions(url: str, since: int) -> list[dict]:
    return httpx.get(url + "/decisions", params={"since": since}, timeout=10).json()["decisions"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the bundled model")
    parser.add_argument("--replicas", default="2,4")
    parser.add_argument("--policies", default="round-robin,least-loaded,cache-aware")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--systems", type=int, default=3, help="shared system prompts")
    parser.add_argument("--system-words", type=int, default=150)
    parser.add_argument("--user-words", type=int, default=20)
    parser.add_argument("--doc-words", type=int, default=0,
                        help="a document of this many words opens each conversation (RAG)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--think-s", type=float, default=0.3,
                        help="mean think time between an answer and the next turn (exponential)")
    parser.add_argument("--rate", type=float, default=1.0, help="conversations per second")
    parser.add_argument("--slo-ttft", type=float, default=1.0, help="goodput: TTFT <= this (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve-args", default="", help="extra `cadence serve` flags")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="replica-bench-")
    os.makedirs(out_dir, exist_ok=True)
    model = ["--model", args.model] if args.model else []
    results = []
    print(f"load average before: {os.getloadavg()}", flush=True)
    for n in (int(x) for x in args.replicas.split(",")):
        procs = []
        try:
            proc, first_url = start(["serve", *model, "--data-parallel-size", str(n),
                                     "--routing-policy", "cache-aware",
                                     *args.serve_args.split()],
                                    os.path.join(out_dir, f"serve-{n}.log"))
            procs.append(proc)
            workers = [w["url"] for w in httpx.get(first_url + "/health").json()["workers"]]
            routers = {"cache-aware": first_url}
            for policy in args.policies.split(","):
                if policy not in routers:
                    p, u = start(["router", "--worker", *workers, "--routing-policy", policy],
                                 os.path.join(out_dir, f"router-{n}-{policy}.log"))
                    procs.append(p)
                    routers[policy] = u
            for policy in args.policies.split(","):
                url = routers[policy]
                convs = workload(args.seed, policy, args.conversations, args.systems,
                                 args.system_words, args.user_words, args.rate,
                                 args.doc_words, args.think_s)
                # The shared system prompts' tokens (what a simulation shares between
                # conversations: `cadence sim --replicas` replays these records).
                system_tokens = {c["system_index"]: len(httpx.post(
                    workers[0] + "/tokenize", timeout=30, json={
                        "messages": [{"role": "system", "content": c["system"]}],
                        "add_generation_prompt": False}).json()["tokens"]) for c in convs}
                hits0, queries0, preempt0 = prefix_counters(workers)
                seq = httpx.get(url + "/decisions", params={"since": 1 << 40}).json()["next"]
                records, wall = asyncio.run(run_workload(url, convs, args.max_tokens))
                hits1, queries1, preempt1 = prefix_counters(workers)
                placed = [d["worker"] for d in decisions(url, seq)]
                ttfts = [r["ttft"] for r in records if r["ttft"] is not None and not r["error"]]
                good = sum(1 for r in records if not r["error"] and r["ttft"] is not None
                           and r["ttft"] <= args.slo_ttft)
                row = {"replicas": n, "policy": policy, "requests": len(records),
                       "errors": sum(1 for r in records if r["error"]),
                       # Cached prompt tokens / prompt tokens, over every request, as the
                       # replicas reported each one (usage.prompt_tokens_details): a request
                       # counts once. The engines' counters count each admission, so a
                       # preempted request's recompute counts again: printed next to it.
                       "prefix_hit_rate": sum(r["cached_tokens"] for r in records)
                       / max(1, sum(r["prompt_tokens"] for r in records)),
                       "prompt_tokens": sum(r["prompt_tokens"] for r in records),
                       "counter_hit_rate": (hits1 - hits0) / max(1.0, queries1 - queries0),
                       "preemptions": preempt1 - preempt0,
                       "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
                       "goodput_rps": good / wall, "wall_s": wall,
                       "per_replica": {w: placed.count(w) for w in workers},
                       "ttfts": ttfts, "records": records, "system_tokens": system_tokens,
                       "load_avg": os.getloadavg()}
                results.append(row)
                print(f"N={n} {policy:>12}: hit {row['prefix_hit_rate']:.3f} (counters "
                      f"{row['counter_hit_rate']:.3f}, preemptions {row['preemptions']:.0f})  TTFT p50 "
                      f"{1000 * (row['ttft_p50'] or 0):.0f} ms p99 "
                      f"{1000 * (row['ttft_p99'] or 0):.0f} ms  goodput "
                      f"{row['goodput_rps']:.2f} req/s  requests {row['requests']} errors "
                      f"{row['errors']}  per replica {list(row['per_replica'].values())}",
                      flush=True)
        finally:
            for p in reversed(procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    print(f"load average after: {os.getloadavg()}; results in {out_dir}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
