"""Run by test_ray_cluster.py in its own process (so that a Ray that cannot start is killed
with it, never hanging the suite): a 2-node Ray cluster on this machine, loopback only, two
`--role both` replicas placed one per node by a custom node resource, a cache-aware router over
them. Prints progress lines and one `RESULT {json}` line; exit 3 with `SKIP reason` when the
cluster does not start.

    python tests/disagg/ray_cluster_main.py MODEL_DIR TMP_DIR
"""

from __future__ import annotations

import json
import os
import signal
import sys

# Before Ray is imported: Ray resolves 127.0.0.1 to the host's "reachable" address (the route
# to the internet), which on a machine with an unroutable interface makes every connection to
# the GCS time out forever. Without cluster mode it keeps loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.pop("RAY_ADDRESS", None)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

RESOURCE = "cadence_replica_slot"
PROMPTS = ["Hi", "Paged attention stores keys and values in fixed-size blocks. The quick brown"]


def say(*parts: object) -> None:
    print(*parts, flush=True)


def main(model_dir: str, tmp_dir: str) -> int:
    import httpx

    try:
        from ray.cluster_utils import Cluster

        import ray
    except ImportError as exc:
        say(f"SKIP Ray is not installed ({exc})")
        return 3
    from cadence.cli import build_parser
    from cadence.disagg.cli import disagg_config_from_args
    from cadence.disagg.launcher import worker_specs
    from cadence.disagg.ray_backend import start_ray_workers, stop_ray_workers
    from cadence.server.cli_serve import configs_from_args
    from tests.disagg.procs import spawn, wait_all, worker_args

    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "resources": {RESOURCE: 1}}
    say("STARTING cluster")
    try:
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={**node, "include_dashboard": False})
        cluster.add_node(**node)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
        cluster.wait_for_nodes(timeout=60)
    except Exception as exc:  # noqa: BLE001 - any failure to start is a reason to skip
        say(f"SKIP the local Ray cluster did not start: {exc!r}")
        return 3
    say("STARTED cluster", cluster.address)
    workers, router = [], None
    try:
        args = build_parser().parse_args(worker_args(model_dir, "both", "--no-startup-profile"))
        server, process = configs_from_args(args)
        specs = worker_specs(0, 0, server, process, disagg_config_from_args(args),
                             num_replicas=2)
        workers = start_ray_workers(specs, "warning", bind_host="127.0.0.1", resource=RESOURCE)
        nodes = ray.get([w.actor.node_id.remote() for w in workers])
        slots = {n["NodeID"]: n["Resources"].get(RESOURCE, 0) for n in ray.nodes()
                 if n["Alive"]}
        router = spawn(tmp_dir, "router", "--worker", *[w.url for w in workers],
                       "--routing-policy", "cache-aware")
        wait_all([router])
        out = {"roles": [w.role for w in workers], "nodes": nodes, "slots": slots,
               "direct": [], "routed": []}
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
            out["direct"].append([httpx.post(w.url + "/v1/completions", json=body, timeout=60)
                                  .json()["choices"][0]["text"] for w in workers])
            out["routed"].append(httpx.post(router.url + "/v1/completions", json=body,
                                            timeout=60).json()["choices"][0]["text"])
        say("RESULT", json.dumps(out))
        return 0
    finally:
        if router is not None:
            router.stop(signal.SIGKILL)
        try:
            stop_ray_workers(workers)
        finally:
            ray.shutdown()
            cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
