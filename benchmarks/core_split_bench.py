"""--core-split auto against the colocated default, colocated eager and --disagg 1:1 (issue 34).

    .venv/bin/python benchmarks/core_split_bench.py                       # all configs, both workloads
    CADENCE_ISA=avx2 .venv/bin/python benchmarks/core_split_bench.py      # the AVX2 kernel tier
    .venv/bin/python benchmarks/core_split_bench.py --rates 2,3 --seeds 1,2,3 --configs coloc,split

Each config is one `cadence serve` (default model, all cores) on this machine, in turn, and gets
the same requests (prompts as token ids, seeded), streamed over HTTP:
  doc-burst  3 chat streams decoding (800 tokens each), then 1.5 s later a document of
             --doc-tokens tokens: the streams' largest stall (biggest gap between two chunks from the document's send to its
             first token, plus a second) and the document's TTFT;
  poisson    Poisson arrivals at each --rates value for --duration seconds: short chats
             (20-200 tokens) and 15% documents of 1000-2500 tokens, 24-64 output tokens each;
             SLO: TTFT <= 2 s (short) / 15 s (documents), every gap between tokens <= 1 s;
             goodput = requests within SLO / (last end - first send), and the fraction.
Configs: coloc (`cadence serve`: the default policy), adaptive (--policy adaptive), slo
(--policy slo, the colocated default before adaptive), eager (--policy eager), disagg (--disagg 1:1), split
(--core-split auto). The load average is printed before and after (the host may be shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from disagg_bench import start  # noqa: E402

CONFIGS = {
    "coloc": [],  # whatever `cadence serve` defaults to
    "adaptive": ["--policy", "adaptive"],
    "slo": ["--policy", "slo"],
    "eager": ["--policy", "eager"],
    "disagg": ["--disagg", "1:1"],
    "split": ["--core-split", "auto"],
    "disjoint": ["--core-split", "disjoint"],
    "interleave": ["--policy", "adaptive", "--core-split", "interleave"],
    "auto": ["--policy", "adaptive", "--core-split", "auto"],
}
SLO_SHORT_TTFT, SLO_LONG_TTFT, SLO_ITL = 2.0, 15.0, 1.0
STREAM_TOKENS = 800


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                      max_tokens: int, delay: float, t0: float) -> dict:
    await asyncio.sleep(max(0.0, t0 + delay - time.monotonic()))
    sent = time.monotonic()
    times: list[float] = []
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "temperature": 0.0, "ignore_eos": True}
    async with client.stream("POST", url + "/v1/completions", json=body, timeout=600) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.monotonic())
    return {"sent": sent, "times": times, "prompt_tokens": len(prompt)}


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


async def doc_burst(url: str, model: str, doc_tokens: int, rep: int,
                    stream_tokens: int = STREAM_TOKENS) -> dict:
    rng = random.Random(34 + 1000 * rep)  # a document of its own per repeat: no cache hits
    streams = [[rng.randrange(100, 40000) for _ in range(30)] for _ in range(3)]
    doc = [rng.randrange(100, 40000) for _ in range(doc_tokens)]
    t0 = time.monotonic()
    async with httpx.AsyncClient() as client:
        # The streams must still decode when the document's first token is out (+1 s): 800
        # tokens outlast any config's document TTFT on a quiet host (240 ended before the
        # document was sent there, and measured no stall at all).
        tasks = [asyncio.create_task(one_request(client, url, model, p, stream_tokens, 0.0, t0))
                 for p in streams]
        doc_task = asyncio.create_task(one_request(client, url, model, doc, 16, 1.5, t0))
        results = await asyncio.gather(*tasks, doc_task)
    d = results[-1]
    doc_first = d["times"][0]
    window = (d["sent"], doc_first + 1.0)
    stall = 0.0
    for r in results[:-1]:
        for a, b in zip(r["times"], r["times"][1:]):
            if b >= window[0] and a <= window[1]:
                stall = max(stall, b - a)
    covered = all(r["times"] and r["times"][-1] >= window[1] for r in results[:-1])
    return {"max_stall_s": stall, "doc_ttft_s": doc_first - d["sent"],
            "streams_cover_window": covered}


async def poisson(url: str, model: str, rate: float, duration: float, seed: int) -> dict:
    rng = random.Random(f"{seed}-{rate}")  # other rates' prompts differ: no prefix-cache hits
    reqs = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            break
        long = rng.random() < 0.15
        n = rng.randint(1000, 2500) if long else rng.randint(20, 200)
        reqs.append((t, [rng.randrange(100, 40000) for _ in range(n)], rng.randint(24, 64), long))
    t0 = time.monotonic()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=256)) as client:
        results = await asyncio.gather(*[one_request(client, url, model, p, m, d, t0)
                                         for d, p, m, _ in reqs])
    good = 0
    all_gaps: list[float] = []
    ttft_long = []
    for (_, _, _, long), r in zip(reqs, results):
        ttft = r["times"][0] - r["sent"] if r["times"] else float("inf")
        g = gaps(r["times"])
        all_gaps += g
        if long:
            ttft_long.append(ttft)
        if ttft <= (SLO_LONG_TTFT if long else SLO_SHORT_TTFT) and max(g, default=0) <= SLO_ITL:
            good += 1
    span = max(r["times"][-1] for r in results if r["times"]) - min(r["sent"] for r in results)
    all_gaps.sort()
    p99 = all_gaps[int(0.99 * (len(all_gaps) - 1))] if all_gaps else 0.0
    return {"requests": len(reqs), "docs": sum(1 for x in reqs if x[3]), "good": good,
            "within_slo": good / len(reqs), "goodput": good / span, "itl_p99_s": p99,
            "max_gap_s": all_gaps[-1] if all_gaps else 0.0,
            "doc_ttft_max_s": max(ttft_long, default=0.0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="coloc,eager,disagg,split")
    parser.add_argument("--workloads", default="doc-burst,poisson")
    parser.add_argument("--doc-tokens", type=int, default=1650)
    parser.add_argument("--rates", default="2")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=1, help="doc-burst runs per config")
    parser.add_argument("--stream-tokens", type=int, default=STREAM_TOKENS,
                        help="doc-burst: tokens each stream decodes (they must outlast the "
                        "document's TTFT + 1 s; see streams_cover_window)")
    parser.add_argument("--extra", default="", help="more `cadence serve` flags for every config")
    args = parser.parse_args()
    out_dir = tempfile.mkdtemp(prefix="core-split-bench-")
    print(f"load before: {os.getloadavg()}; CADENCE_ISA={os.environ.get('CADENCE_ISA', 'best')}",
          flush=True)
    rows = []
    for name in args.configs.split(","):
        proc, url = start(CONFIGS[name] + args.extra.split(), os.path.join(out_dir, f"{name}.log"))
        try:
            model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
            for wl in args.workloads.split(","):
                if wl == "doc-burst":
                    for rep in range(args.repeats):
                        m = asyncio.run(doc_burst(url, model, args.doc_tokens, rep,
                                                 args.stream_tokens))
                        rows.append({"config": name, "workload": wl, "rep": rep, **m})
                        print(json.dumps(rows[-1]), flush=True)
                else:
                    for rate in [float(r) for r in args.rates.split(",")]:
                        for seed in [int(s) for s in args.seeds.split(",")]:
                            m = asyncio.run(poisson(url, model, rate, args.duration, seed))
                            rows.append({"config": name, "workload": wl, "rate": rate,
                                         "seed": seed, **m})
                            print(json.dumps(rows[-1]), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"load after: {os.getloadavg()}", flush=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"results: {out_dir}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
