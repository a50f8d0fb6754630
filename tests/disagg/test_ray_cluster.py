"""Ray for real: a local 2-node Ray cluster (ray.cluster_utils.Cluster, loopback only), two
replicas placed one per node by a custom node resource (`--ray-worker-resource`), a
cache-aware router over them: each node hosts one replica, and greedy outputs through the
router equal each replica's own. Runs in a child process with a hard timeout: where Ray cannot
start the test skips with the reason, and it never hangs the suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")

pytestmark = pytest.mark.timeout(400)

HARD_TIMEOUT_S = 300


def test_two_node_ray_cluster_places_one_replica_per_node(tiny_llama_dir, tmp_path):
    script = os.path.join(os.path.dirname(__file__), "ray_cluster_main.py")
    root = os.path.dirname(os.path.dirname(os.path.dirname(script)))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, script, tiny_llama_dir, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=HARD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray daemons it started
        output, _ = proc.communicate()
        if "STARTED cluster" not in output:
            pytest.skip(f"the local Ray cluster did not start in {HARD_TIMEOUT_S} s:\n"
                        + output[-2000:])
        pytest.fail(f"the Ray cluster test hung after the cluster started:\n{output[-4000:]}")
    lines = output.splitlines()
    skip = next((line for line in lines if line.startswith("SKIP ")), None)
    if proc.returncode == 3 and skip:
        pytest.skip(skip[5:])
    result = next((line for line in lines if line.startswith("RESULT ")), None)
    assert proc.returncode == 0 and result, output[-4000:]
    out = json.loads(result[len("RESULT "):])
    assert out["roles"] == ["both", "both"]
    # One replica per node: each node offers one slot of the resource both workers ask for.
    assert len(set(out["nodes"])) == 2, out
    assert all(out["slots"].get(n) == 1 for n in out["nodes"]), out
    for direct, routed in zip(out["direct"], out["routed"]):
        assert direct[0] == direct[1] == routed and routed, out
