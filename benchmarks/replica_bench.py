"""Data-parallel replicas: cache-aware vs least-loaded vs round-robin routing on a multi-turn
workload, in the same run.

    .venv/bin/python benchmarks/replica_bench.py                   # 2 and 4 replicas
    # RAG chat whose working set fits the two replicas' caches together but not one's
    # (issue 33's point, docs/performance.md#replicas-and-routing; one run takes ~5 minutes):
    .venv/bin/python benchmarks/replica_bench.py --replicas 2 --conversations 16 --rate 0.5 \
        --systems 3 --system-words 40 --turn-doc-words 130 --user-words 15 --max-tokens 48 \
        --think-s 2 --serve-args "--num-kv-blocks 384" --out /tmp/replicas/ra
    # its profile right after, then the simulator over several such runs (median against
    # median: one run's p50 is one draw of a closed loop near round-robin's saturation):
    .venv/bin/cadence sim --calibrate --threads 1 --calibrate-rounds 3 \
        --save-calibration /tmp/replicas/ra/cal.json
    .venv/bin/cadence sim --calibration /tmp/replicas/r{a,b,c}/cal.json \
        --compare /tmp/replicas/r{a,b,c}/results.json
    # other workload points on paper first: benchmarks/replica_sim_scan.py --run /tmp/replicas/ra

With 2 replicas cache-aware's hit rate at this point is 1.4-2.4x round-robin's run to run
(median 1.8x over eight runs; round-robin's own hit moves with eviction timing): routing alone
is worth at most 2x with 2 replicas (replica_sim_scan.routing_only_ratio: 1.9 here), more
comes only from round-robin's misses overloading its replicas, and constant or uniform think
times (--think-dist) do not change that (performance.md says why).

Per replica count: `cadence serve --data-parallel-size N --routing-policy cache-aware` (N
`--role both` replicas with an equal share of the cores, and its router), then two more
`cadence router --worker ...` over the same replicas (least-loaded, round-robin). Each policy
gets the same workload (same seed) with its texts tagged by the policy's name, so no run
finds another's prefixes cached. Workload: conversations of 4-8 turns (uniform), each opening
with one of a few shared system prompts; conversations start as Poisson arrivals, each next
turn is sent after the answer plus a think time (--think-s; --think-dist exponential by
default, constant, or uniform over +-(--think-spread) of it), and carries the whole chat so
far (answers included); --doc-words adds a document of its own to each
conversation's first turn, --turn-doc-words a passage to every turn (RAG chat), and
--serve-args "--num-kv-blocks N" sizes the replicas' caches. Printed per policy: prefix-cache hit rate (cached prompt tokens / prompt tokens over
all requests, from each request's usage as its replica reported it; the engines' counters,
which count a preempted request's readmission again, next to it), TTFT p50/p99, goodput
(requests per second that finished with TTFT <= --slo-ttft), requests per replica, the hop
(mean client TTFT less the replicas' own: router, HTTP), and for cache-aware a routing audit
(routing_audit below); results (with every request's record, which `cadence sim --compare`
replays) in --out as JSON. For the simulator's check each row also holds what the run measured
about its host: every process's CPU by role every 0.5 s (cpu_samples), each record's replica
view (the replicas' --trace files: arrival, first scheduled, first token), the replicas' steps
as the cost model sees them (step_sample) and the engine loop's work per step beyond the
forward (engine_step_overhead_s).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cadence.bench.server_process import launch_cli
from cadence.core.step_cost import StepFeatures
from cadence.sim.think_time import ThinkTime, add_think_arguments
from cadence.server.proc_stat import command_line, cpu_seconds, descendants, thread_cpu_seconds

WORDS = ("the model reads each token of the prompt and writes keys and values into blocks of "
         "its cache while the scheduler packs prefill chunks next to decode steps under a "
         "budget so that streams keep flowing and long documents do not stall them").split()


COUNTERS = ("cadence:prefix_cache_hits_total", "cadence:prefix_cache_queries_total",
            "cadence:num_preemptions_total", "cadence:time_to_first_token_seconds_sum",
            "cadence:time_to_first_token_seconds_count")


def replica_counters(urls: list[str]) -> dict[str, float]:
    """COUNTERS of the replicas' engines, summed (prefix hits and queries, preemptions, the
    server-side TTFT's sum and count: arrival at the replica to its first token)."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(url + "/metrics",
                                                               timeout=10).text):
            for s in family.samples:
                if s.name in out and not s.labels.get("le"):
                    out[s.name] += s.value
    return out


CPU_ROLES = ("engine_loop", "engine_other", "front_end", "template", "router", "load_generator",
             "other")


def cpu_by_role(router_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of every process of the run, by what it does: each engine process's
    loop thread (its main thread: the steps and the work between them) and its other threads
    (admission, tokenizing, the stats heartbeat), the replicas' front ends (HTTP, SSE), the
    chat-template workers, the routers (the serve process, which also launched the replicas,
    and each `cadence router`) and this process (the load generator). What the engines'
    steps share the cores with is everything but engine_loop."""
    out = dict.fromkeys(CPU_ROLES, 0.0)
    for root in router_pids:
        out["router"] += cpu_seconds(root)
        for pid in descendants(root):
            cmd = command_line(pid)
            if "engine_process" in cmd:
                threads = thread_cpu_seconds(pid)
                out["engine_loop"] += threads.pop(pid, 0.0)
                out["engine_other"] += sum(threads.values())
            elif "worker_main" in cmd:
                out["front_end"] += cpu_seconds(pid)
            elif "template_worker" in cmd:
                out["template"] += cpu_seconds(pid)
            else:
                out["other"] += cpu_seconds(pid)
    out["load_generator"] = cpu_seconds(os.getpid())
    return out


class CpuSampler:
    """cpu_by_role every `period_s` in a thread, while the workload runs: the CPU the rest of
    the stack takes, over time, to set against the requests and tokens of each interval."""

    def __init__(self, pids: list[int], period_s: float = 0.5) -> None:
        self.pids, self.period_s = pids, period_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), cpu_by_role(self.pids)))
            if self._stop.wait(self.period_s):
                return

    def __enter__(self) -> "CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic(), cpu_by_role(self.pids)))


def read_traces(paths: list[str]
                ) -> tuple[dict[str, tuple[int, dict]], list[list[dict]], list[list[dict] | None]]:
    """The replicas' --trace files: each finished request's timeline by its id (with the
    replica's index), each replica's steps, and each one's startup profile (its meta line's
    rows: what its scheduler planned prompt chunks from; None where the trace has none)."""
    timelines: dict[str, tuple[int, dict]] = {}
    steps: list[list[dict]] = []
    profiles: list[list[dict] | None] = []
    for index, path in enumerate(paths):
        mine = []
        profiles.append(None)
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short at shutdown
                        continue
                    if rec.get("type") == "request":
                        timelines[rec["req_id"]] = (index, rec)
                    elif rec.get("type") == "step":
                        mine.append(rec)
                    elif rec.get("type") == "meta" and rec.get("startup_profile"):
                        profiles[-1] = rec["startup_profile"]
        steps.append(mine)
    return timelines, steps, profiles


def attach_engine_records(row: dict, timelines: dict, steps: list[list[dict]]) -> list[list]:
    """Each record of `row` gets its replica's view (`engine`: the replica's index, arrival,
    first scheduled, first token, in seconds from the run's start as `sent` is, its cached
    and prompt tokens); returns the steps of the run's window per replica as [start, seconds,
    forward seconds, prefill tokens, decode tokens, sequences] (start from the run's start)."""
    t0, t1 = row["window"]
    for rec in row["records"]:
        match = timelines.get(rec.get("id") or "")
        if match is None:  # an id the replica extended (e.g. one per choice)
            match = next((v for k, v in timelines.items()
                          if rec.get("id") and k.startswith(rec["id"])), None)
        if match is None:
            continue
        index, tl = match
        rel = {k: (tl[k] - t0 if tl.get(k) is not None else None)
               for k in ("arrival_time", "first_scheduled_time", "first_token_time")}
        rec["engine"] = {"replica": index, "arrival": rel["arrival_time"],
                         "scheduled": rel["first_scheduled_time"],
                         "first_token": rel["first_token_time"],
                         "cached_tokens": tl.get("num_cached_tokens"),
                         "prompt_tokens": tl.get("num_prompt_tokens"),
                         "preemptions": tl.get("num_preemptions")}
    window = [[st for st in mine if t0 <= st["t_start"] <= t1] for mine in steps]
    # The engine loop's work per step beyond the forward the profile times: inside the step's
    # bracket (schedule, update, detokenize) and between two steps of a busy replica (the
    # batch message out, arrivals in, the trace line); medians over the run's steps.
    inside = [st["t_end"] - st["t_start"] - st["forward_time_s"] for mine in window for st in mine]
    between = [b["t_start"] - a["t_end"] for mine in window for a, b in zip(mine, mine[1:])
               if 0 <= b["t_start"] - a["t_end"] < 0.02]
    row["engine_step_overhead_s"] = {
        "inside": statistics.median(inside) if inside else 0.0,
        "between": statistics.median(between) if between else 0.0}
    row["step_sample"] = step_sample(window, {k: tl for k, (_, tl) in timelines.items()})
    return [[[st["t_start"] - t0, st["t_end"] - st["t_start"], st["forward_time_s"],
              st["num_prefill_tokens"], st["num_decode_tokens"], st["num_seqs"]]
             for st in mine] for mine in window]


def step_sample(window: list[list[dict]], timelines: dict[str, dict]) -> list[list]:
    """Every traced step as the cost model sees it, to price against the machine profile
    (cadence.sim.run_speed): [forward seconds, prefill tokens, decode tokens, attention pairs,
    per-op path (0/1), sequences, the share of its time another replica was computing]. Each
    decode's context comes from its request's token times, each prompt chunk's start from the
    request's cached tokens and its earlier chunks."""
    out = []
    for index, mine in enumerate(window):
        others = sorted((st["t_start"], st["t_end"]) for j, theirs in enumerate(window)
                        if j != index for st in theirs)
        starts = [a for a, _ in others]
        done: dict[str, int] = {}
        for st in mine:
            chunks = dict(zip(st["prefill_req_ids"], st["prefill_chunk_tokens"]))
            features, known = StepFeatures(), True
            for rid in st["req_ids"]:
                tl = timelines.get(rid)
                if tl is None:
                    known = False
                    break
                if rid in chunks:
                    start = (tl.get("num_cached_tokens") or 0) + done.get(rid, 0)
                    features = features + StepFeatures.of_chunk(start, chunks[rid], True)
                    done[rid] = done.get(rid, 0) + chunks[rid]
                else:
                    made = bisect.bisect_left(tl["token_times"], st["t_start"])
                    ctx = tl["num_prompt_tokens"] + made - 1
                    features = features + StepFeatures.of_chunk(ctx, 1, False)
            if not known or not st["req_ids"]:
                continue
            a, b = st["t_start"], st["t_end"]
            k, overlap = bisect.bisect_left(starts, a - 5.0), 0.0
            while k < len(others) and others[k][0] < b:
                overlap += max(0.0, min(b, others[k][1]) - max(a, others[k][0]))
                k += 1
            out.append([round(st["forward_time_s"], 6), features.prefill_tokens,
                        features.decode_tokens, features.attention_pairs, features.prompt_step,
                        len(st["req_ids"]), round(min(1.0, overlap / max(1e-9, b - a)), 3)])
    return out


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def workload(seed: int, tag: str, num_conversations: int, num_systems: int,
             system_words: int, user_words: int, rate: float,
             doc_words: int = 0, think_s: float = 0.3, turn_doc_words: int = 0,
             think_dist: str = "exponential", think_spread: float = 0.25) -> list[dict]:
    rng = random.Random(seed)
    think = ThinkTime(think_dist, think_s, think_spread)
    systems = [f"[{tag}] You are assistant {i}. " + words(rng, system_words)
               for i in range(num_systems)]
    out, t = [], 0.0
    for c in range(num_conversations):
        t += rng.expovariate(rate)
        system = rng.randrange(num_systems)
        users = []
        for k in range(rng.randint(4, 8)):
            # The first turn's document (--doc-words), then a passage retrieved for every
            # turn (--turn-doc-words: RAG chat, where each question brings its own context).
            doc = doc_words if k == 0 else 0
            passage = (f"Document {c}: " + words(rng, doc) + "\n") if doc else ""
            if turn_doc_words:
                passage += f"Passage {c}.{k}: " + words(rng, turn_doc_words) + "\n"
            users.append(passage + f"Question {c}.{k}: " + words(rng, user_words))
        out.append({"start": t, "system": systems[system], "system_index": system,
                    "users": users, "think": [think.draw(rng) for _ in range(8)]})
    return out


async def one_turn(client: httpx.AsyncClient, url: str, messages: list[dict],
                   max_tokens: int) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start, wall_start = time.perf_counter(), time.time()
    ttft, text, error, usage, resp_id = None, [], None, {}, None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            resp_id = resp_id or event.get("id")
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
    return {"ttft": ttft, "text": "".join(text), "error": error, "sent": start, "id": resp_id,
            "wall_sent": wall_start,
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
        return records, t0, time.perf_counter() - t0


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def decisions(url: str, since: int) -> list[dict]:
    return httpx.get(url + "/decisions", params={"since": since}, timeout=10).json()["decisions"]


def routing_audit(records: list[dict], placed: list[dict]) -> dict | None:
    """Did cache-aware routing leave hits on the table? Each request is matched to its
    decision (same prompt tokens, the first decision at or after it was sent), and counted:
    - `not_longest`: the chosen replica held a shorter prefix (router's view) than another
      healthy one, with the cost term that outweighed it (streams / load / KV room) and the
      prompt tokens given up (`tokens_left`, of all prompt tokens);
    - `view_short` / `view_long`: the replica's reported cached tokens were more / fewer than
      the router expected (its events lagged the cache, or the blocks were evicted or were
      still being written when the request was admitted), with the tokens involved."""
    decisions = [d for d in placed if d.get("candidates")]
    if not decisions:
        return None
    pool: dict[int, list[dict]] = {}
    for d in sorted(decisions, key=lambda d: d["t"]):
        pool.setdefault(d["prompt_tokens"], []).append(d)
    out = {"decisions": len(decisions), "matched": 0, "not_longest": 0, "tokens_left": 0,
           "outweighed_by": {}, "view_short": 0, "view_short_tokens": 0, "view_long": 0,
           "view_long_tokens": 0, "prompt_tokens": 0}
    for rec in sorted(records, key=lambda r: r["wall_sent"]):
        options = pool.get(rec["prompt_tokens"], [])
        match = next((d for d in options if d["t"] >= rec["wall_sent"] - 0.05), None)
        if match is None:
            continue
        options.remove(match)
        out["matched"] += 1
        out["prompt_tokens"] += rec["prompt_tokens"]
        healthy = [c for c in match["candidates"] if c["healthy"]] or match["candidates"]
        chosen = match["candidates"][0]
        best = max(healthy, key=lambda c: c["cached_tokens"])
        if best["cached_tokens"] > chosen["cached_tokens"]:
            out["not_longest"] += 1
            out["tokens_left"] += best["cached_tokens"] - chosen["cached_tokens"]
            # Which term made the longer prefix's replica dearer than the chosen one.
            gaps = {k: best["cost"][k] - chosen["cost"][k] for k in chosen["cost"]}
            term = max(gaps, key=gaps.get)
            out["outweighed_by"][term] = out["outweighed_by"].get(term, 0) + 1
        expected = match.get("expected_cached_tokens", 0)
        if rec["cached_tokens"] > expected:
            out["view_short"] += 1
            out["view_short_tokens"] += rec["cached_tokens"] - expected
        elif rec["cached_tokens"] < expected:
            out["view_long"] += 1
            out["view_long_tokens"] += expected - rec["cached_tokens"]
    return out


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
    parser.add_argument("--turn-doc-words", type=int, default=0,
                        help="a passage of this many words on every turn (RAG chat)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--think-s", type=float, default=0.3,
                        help="mean think time between an answer and the next turn")
    add_think_arguments(parser)
    parser.add_argument("--rate", type=float, default=1.0, help="conversations per second")
    parser.add_argument("--slo-ttft", type=float, default=1.0, help="goodput: TTFT <= this (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve-args", default="", help="extra `cadence serve` flags")
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-traces", dest="traces", action="store_false",
                        help="run the replicas without --trace (by default each writes its "
                             "steps and requests to --out/trace-N.I.jsonl: every record then "
                             "gets its replica's arrival, scheduling and first-token times, "
                             "and --out/steps-N-POLICY.json the replicas' steps)")
    args = parser.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="replica-bench-")
    os.makedirs(out_dir, exist_ok=True)
    model = ["--model", args.model] if args.model else []
    results = []
    print(f"load average before: {os.getloadavg()}", flush=True)
    for n in (int(x) for x in args.replicas.split(",")):
        procs = []
        rows_of_n = []
        trace = [f"--trace={os.path.join(out_dir, f'trace-{n}.jsonl')}"] if args.traces else []
        try:
            proc, first_url = launch_cli(["serve", *model, "--data-parallel-size", str(n),
                                     "--routing-policy", "cache-aware",
                                     *args.serve_args.split(), *trace],
                                    os.path.join(out_dir, f"serve-{n}.log"))
            procs.append(proc)
            workers = [w["url"] for w in httpx.get(first_url + "/health").json()["workers"]]
            routers = {"cache-aware": first_url}
            for policy in args.policies.split(","):
                if policy not in routers:
                    p, u = launch_cli(["router", "--worker", *workers, "--routing-policy", policy],
                                 os.path.join(out_dir, f"router-{n}-{policy}.log"))
                    procs.append(p)
                    routers[policy] = u
            for policy in args.policies.split(","):
                url = routers[policy]
                convs = workload(args.seed, policy, args.conversations, args.systems,
                                 args.system_words, args.user_words, args.rate,
                                 args.doc_words, args.think_s, args.turn_doc_words,
                                 args.think_dist, args.think_spread)
                # The shared system prompts' tokens (what a simulation shares between
                # conversations: `cadence sim --replicas` replays these records).
                system_tokens = {c["system_index"]: len(httpx.post(
                    workers[0] + "/tokenize", timeout=30, json={
                        "messages": [{"role": "system", "content": c["system"]}],
                        "add_generation_prompt": False}).json()["tokens"]) for c in convs}
                before = replica_counters(workers)
                seq = httpx.get(url + "/decisions", params={"since": 1 << 40}).json()["next"]
                with CpuSampler([p.pid for p in procs]) as sampler:
                    records, t0, wall = asyncio.run(run_workload(url, convs, args.max_tokens))
                cpu_before, cpu_after = sampler.samples[0][1], sampler.samples[-1][1]
                after = replica_counters(workers)
                delta = {k: after[k] - before[k] for k in COUNTERS}
                placed_decisions = decisions(url, seq)
                placed = [d["worker"] for d in placed_decisions]
                audit = routing_audit(records, placed_decisions)
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
                       "counter_hit_rate": delta["cadence:prefix_cache_hits_total"]
                       / max(1.0, delta["cadence:prefix_cache_queries_total"]),
                       "preemptions": delta["cadence:num_preemptions_total"],
                       # Mean time outside the replicas' engines before a first token: the
                       # client's TTFT less the replica's own (arrival there to its first
                       # token): the router (its /tokenize call for cache-aware), HTTP, SSE.
                       # `cadence sim --compare` takes it as the run's hop.
                       "hop_s": statistics.fmean(ttfts) - delta[
                           "cadence:time_to_first_token_seconds_sum"] / max(1.0, delta[
                               "cadence:time_to_first_token_seconds_count"]) if ttfts else None,
                       "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
                       "goodput_rps": good / wall, "wall_s": wall,
                       "per_replica": {w: placed.count(w) for w in workers},
                       "routing_audit": audit,
                       "ttfts": ttfts, "records": records, "system_tokens": system_tokens,
                       "load_avg": os.getloadavg(),
                       # CPU seconds each role used during the run (cpu_by_role), and the
                       # window on the monotonic clock the engines' traces are stamped in.
                       "cpu_s": {k: cpu_after[k] - cpu_before[k] for k in CPU_ROLES},
                       "cores": len(os.sched_getaffinity(0)), "window": [t0, t0 + wall],
                       "cpu_samples": [[round(t - t0, 4), {k: round(v, 3) for k, v in c.items()}]
                                       for t, c in sampler.samples]}
                results.append(row)
                rows_of_n.append(row)
                print(f"N={n} {policy:>12}: hit {row['prefix_hit_rate']:.3f} (counters "
                      f"{row['counter_hit_rate']:.3f}, preemptions {row['preemptions']:.0f})  TTFT p50 "
                      f"{1000 * (row['ttft_p50'] or 0):.0f} ms p99 "
                      f"{1000 * (row['ttft_p99'] or 0):.0f} ms  goodput "
                      f"{row['goodput_rps']:.2f} req/s  hop {1000 * (row['hop_s'] or 0):.0f} ms  "
                      f"requests {row['requests']} errors "
                      f"{row['errors']}  per replica {list(row['per_replica'].values())}",
                      flush=True)
                print("    CPU s during the run: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in row["cpu_s"].items()) + f" (wall {wall:.1f} s)",
                    flush=True)
                if audit:
                    print(f"    routing audit: {audit['matched']}/{audit['decisions']} matched; "
                          f"chosen replica not the longest prefix {audit['not_longest']} "
                          f"({audit['tokens_left']} of {audit['prompt_tokens']} prompt tokens "
                          f"left, outweighed by {audit['outweighed_by']}); reported hit above "
                          f"the router's view {audit['view_short']} "
                          f"(+{audit['view_short_tokens']} tokens), below {audit['view_long']} "
                          f"(-{audit['view_long_tokens']})", flush=True)
        finally:
            for p in reversed(procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if args.traces:  # written at the replicas' exit
            timelines, steps, profiles = read_traces(
                [os.path.join(out_dir, f"trace-{n}.{i}.jsonl") for i in range(n)])
            for row in rows_of_n:
                # Replica i's startup profile: `cadence sim --compare` seeds simulated replica
                # i's scheduler with it, so its chunk plans are the engine's.
                row["engine_profiles"] = profiles
                window_steps = attach_engine_records(row, timelines, steps)
                with open(os.path.join(out_dir, f"steps-{n}-{row['policy']}.json"), "w") as f:
                    json.dump(window_steps, f)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    print(f"load average after: {os.getloadavg()}; results in {out_dir}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
