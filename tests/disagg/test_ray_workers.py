"""--distributed-executor-backend ray: a prefill and a decode worker as Ray actors on a local
Ray cluster (loopback only) serve, through the router, the same greedy tokens as colocated."""

from __future__ import annotations

import signal

import pytest

from cadence.cli import build_parser
from cadence.disagg.cli import disagg_config_from_args
from cadence.disagg.launcher import worker_specs
from cadence.server.cli_serve import configs_from_args
from tests.disagg.procs import spawn, wait_all, worker_args
from tests.disagg.test_router_e2e import PROMPTS, _complete

ray = pytest.importorskip(
    "ray", reason="Ray is not installed (pip install -e '.[ray]'): the Ray backend is untested")

pytestmark = pytest.mark.timeout(600)


def test_ray_actor_workers_match_colocated(tiny_llama_dir, tmp_path):
    from cadence.disagg.ray_backend import start_ray_workers, stop_ray_workers

    args = build_parser().parse_args(worker_args(tiny_llama_dir, "both"))
    server, process = configs_from_args(args)
    specs = worker_specs(1, 1, server, process, disagg_config_from_args(args))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    workers, routers = [], []
    try:
        workers = start_ray_workers(specs, "warning", bind_host="127.0.0.1")
        assert [w.role for w in workers] == ["prefill", "decode"]
        prefill, decode = workers[0].url, workers[1].url
        routers = [spawn(str(tmp_path), "router", "--prefill", prefill, "--decode", decode,
                         "--routing-policy", policy) for policy in ("always", "never")]
        wait_all(routers)
        disagg = [_complete(routers[0], p) for p in PROMPTS]
        colocated = [_complete(routers[1], p) for p in PROMPTS]
        assert disagg == colocated and all(n == 12 for _, n in disagg)
        m = routers[0].metrics()
        assert m["cadence_router:requests_total{route=disaggregated}"] == len(PROMPTS)
    finally:
        for r in routers:
            r.stop(signal.SIGKILL)
        stop_ray_workers(workers)
        ray.shutdown()
