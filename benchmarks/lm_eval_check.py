"""Write three tiny lm-evaluation-harness tasks (local jsonl, no dataset hub) and run
lm-eval's `local-completions` / `local-chat-completions` clients against a running
`cadence serve`.

    cadence serve --port 8731 &
    python benchmarks/lm_eval_check.py --lm-eval /path/to/venv/bin/lm_eval \
        --base-url http://127.0.0.1:8731 --tokenizer /path/to/SmolLM2-tokenizer --out /tmp/lmeval

Tasks (written under --out/tasks):
- cadence_mc: 20 easy multiple-choice items, 4 choices (loglikelihood; acc, acc_norm);
- cadence_ppl: perplexity of 4 short paragraphs (loglikelihood_rolling);
- cadence_gen: 8 short completions cut at "." or a newline (generate_until; exact_match).
lm-eval itself is not a dependency of cadence: give the path of its `lm_eval` executable.
With --verify, the per-choice loglikelihoods lm-eval logged are recomputed with cadence's
offline `LLM` (SamplingParams(prompt_logprobs=0)) on the same token ids and compared.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

# (question, choices, index of the right one): facts a 135M model should mostly know.
MC_ITEMS = [
    ("The capital of France is", ["Paris", "Berlin", "Madrid", "Rome"], 0),
    ("The capital of Germany is", ["Lisbon", "Berlin", "Oslo", "Cairo"], 1),
    ("The capital of Italy is", ["Vienna", "Athens", "Rome", "Dublin"], 2),
    ("The capital of Japan is", ["Seoul", "Beijing", "Bangkok", "Tokyo"], 3),
    ("The capital of Spain is", ["Madrid", "Prague", "Warsaw", "Helsinki"], 0),
    ("One, two, three, four,", ["nine", "five", "twelve", "seven"], 1),
    ("Monday, Tuesday,", ["Sunday", "Friday", "Wednesday", "Saturday"], 2),
    ("January, February,", ["December", "July", "October", "March"], 3),
    ("The sun rises in the", ["east", "north", "south", "basement"], 0),
    ("Water freezes at zero degrees", ["Kelvin", "Celsius", "Newton", "Joule"], 1),
    ("A cat says", ["moo", "quack", "meow", "oink"], 2),
    ("The opposite of hot is", ["loud", "tall", "green", "cold"], 3),
    ("The color of the sky on a clear day is", ["blue", "purple", "brown", "black"], 0),
    ("A week has seven", ["hours", "days", "years", "meters"], 1),
    ("Humans breathe in", ["sand", "water", "oxygen", "metal"], 2),
    ("The largest planet in our solar system is", ["Mars", "Venus", "Mercury", "Jupiter"], 3),
    ("Bees make", ["honey", "glass", "steel", "paper"], 0),
    ("The opposite of up is", ["left", "down", "fast", "red"], 1),
    ("Two plus two equals", ["seven", "ten", "four", "one"], 2),
    ("The first letter of the English alphabet is", ["Z", "Q", "M", "A"], 3),
]

PPL_TEXTS = [
    "The cat sat on the mat. It was a sunny day, and the cat was happy to rest in the warm light.",
    "Paris is the capital and most populous city of France. It is known for its museums, "
    "its architecture and the Eiffel Tower, which was built in 1889.",
    "Water is made of hydrogen and oxygen. It freezes at zero degrees Celsius and boils at one "
    "hundred degrees Celsius at sea level.",
    "Once upon a time, there was a little girl who lived in a village near the forest. "
    "Every day she walked to her grandmother's house with a basket of bread.",
]

GEN_ITEMS = [
    ("The capital of France is", "Paris"),
    ("The capital of Germany is", "Berlin"),
    ("The capital of Italy is", "Rome"),
    ("The capital of Japan is", "Tokyo"),
    ("The capital of Spain is", "Madrid"),
    ("The capital of England is", "London"),
    ("The capital of Russia is", "Moscow"),
    ("The capital of Egypt is", "Cairo"),
]


def write_tasks(root: str) -> str:
    """Write the jsonl data and task YAMLs under root/tasks; returns that folder."""
    tasks = os.path.join(root, "tasks")
    os.makedirs(tasks, exist_ok=True)

    def jsonl(name, rows):
        path = os.path.join(tasks, name)
        with open(path, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        return path

    mc = jsonl("mc.jsonl", [{"question": q, "choices": c, "answer": a} for q, c, a in MC_ITEMS])
    ppl = jsonl("ppl.jsonl", [{"text": t} for t in PPL_TEXTS])
    gen = jsonl("gen.jsonl", [{"prompt": p, "answer": a} for p, a in GEN_ITEMS])
    yamls = {
        "cadence_mc.yaml": f"""task: cadence_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {mc}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
""",
        "cadence_ppl.yaml": f"""task: cadence_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {ppl}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
        "cadence_gen.yaml": f"""task: cadence_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {gen}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: " "
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 12
  do_sample: false
  temperature: 0.0
filter_list:
  - name: strip
    filter:
      - function: regex
        regex_pattern: "^\\\\s*(\\\\S+)"
        group_select: 0
      - function: take_first
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
""",
    }
    for name, text in yamls.items():
        with open(os.path.join(tasks, name), "w") as f:
            f.write(text)
    return tasks


def run_lm_eval(args, tasks_dir: str, model_kind: str, tasks: str, url_path: str) -> str:
    out = os.path.join(args.out, model_kind)
    model_args = (f"base_url={args.base_url}{url_path},model={args.model},"
                  f"num_concurrent={args.num_concurrent},max_retries=1")
    if args.tokenizer:
        model_args += f",tokenizer={args.tokenizer},tokenizer_backend=huggingface"
    cmd = [args.lm_eval, "--model", model_kind, "--model_args", model_args,
           "--tasks", tasks, "--include_path", tasks_dir, "--log_samples", "--output_path", out]
    if model_kind == "local-completions":  # prompts per request (chat sends one)
        cmd += ["--batch_size", str(args.batch_size)]
    if model_kind == "local-chat-completions":
        cmd.append("--apply_chat_template")
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1",
                                         "HF_DATASETS_OFFLINE": "1"})
    return out


def verify(out: str, model: str | None) -> float:
    """Largest |lm-eval loglikelihood - cadence offline prompt logprob sum| over cadence_mc."""
    from cadence.core.sampling_params import SamplingParams
    from cadence.engine.llm import LLM

    files = glob.glob(os.path.join(out, "**", "samples_cadence_mc_*.jsonl"), recursive=True)
    if not files:
        sys.exit(f"no samples_cadence_mc_*.jsonl under {out}")
    llm = LLM(model=model) if model else LLM()
    tok = llm.get_tokenizer()
    worst = 0.0
    with open(sorted(files)[-1]) as f:
        samples = [json.loads(line) for line in f]
    for s in samples:
        args = s["arguments"]
        pairs = [tuple(a.values())[:2] for a in args.values()] if isinstance(args, dict) \
            else [tuple(a)[:2] for a in args]
        for (context, continuation), resp in zip(pairs, s["resps"]):
            # lm-eval's split: trailing spaces of the context go to the continuation, the
            # continuation's ids are what encoding the whole adds after the context's.
            stripped = context.rstrip(" ")
            continuation = context[len(stripped):] + continuation
            ctx_ids = tok.encode(stripped)
            ids = tok.encode(stripped + continuation)
            params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
            res = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
            mine = sum(res.prompt_logprobs[p][ids[p]].logprob
                       for p in range(len(ctx_ids), len(ids)))
            theirs = float(resp[0][0])
            worst = max(worst, abs(mine - theirs))
    print(f"verified {len(samples)} docs: max |lm-eval - offline| = {worst:.2e}")
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm-eval", required=True, help="path of lm-eval's `lm_eval` executable")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="served model name (default: the first listed)")
    ap.add_argument("--tokenizer", default=None, help="HF tokenizer folder for lm-eval")
    ap.add_argument("--out", default="/tmp/cadence_lm_eval")
    ap.add_argument("--num-concurrent", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--verify-model", default=None,
                    help="model path for the offline check (default: cadence's default model)")
    ap.add_argument("--verify-only", action="store_true", help="only check an earlier --out")
    args = ap.parse_args()
    if args.verify_only:  # offline: no server needed
        verify(os.path.join(args.out, "local-completions"), args.verify_model)
        return
    if args.model is None:
        import httpx
        args.model = httpx.get(args.base_url + "/v1/models").json()["data"][0]["id"]
    tasks_dir = write_tasks(args.out)
    out = run_lm_eval(args, tasks_dir, "local-completions", "cadence_mc,cadence_ppl,cadence_gen",
                      "/v1/completions")
    run_lm_eval(args, tasks_dir, "local-chat-completions", "cadence_gen", "/v1/chat/completions")
    if args.verify:
        verify(out, args.verify_model)


if __name__ == "__main__":
    main()
