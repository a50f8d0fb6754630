"""`--distributed-executor-backend ray`: the workers of `cadence serve --disagg P:D` as Ray
actors, so a Ray cluster places prefill and decode workers on its nodes.

Each actor owns one worker (`cadence.disagg.worker_main`: HTTP server + engine process) on the
node Ray put it on, listening on that node's address (or `bind_host`), its KV served over TCP so
that decode workers on other nodes can pull it. The router (in the launching process) reaches
the workers by their URLs; KV moves worker to worker, never through Ray's object store.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cadence.disagg.launcher import WorkerSpec


def _require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # optional dependency: pip install 'cadence[ray]'
        raise RuntimeError("--distributed-executor-backend ray needs Ray: "
                           "pip install 'cadence[ray]'") from exc
    return ray


class _WorkerActor:
    """One worker process on this actor's node (wrapped by ray.remote in start_ray_workers)."""

    def __init__(self, spec_json: str, bind_host: str | None, log_level: str) -> None:
        import json

        import ray

        from cadence.disagg.launcher import free_port, start_worker_process
        from cadence.engine.engine_process import EngineProcessConfig
        from cadence.server.config import ServerConfig

        data = json.loads(spec_json)
        host = bind_host or ray.util.get_node_ip_address()
        server = dataclasses.replace(ServerConfig(**data["server"]), host=host,
                                     port=free_port(host))
        process = EngineProcessConfig.from_json(json.dumps(data["process"]))
        engine = dict(process.engine_config)
        disagg = dict(engine.get("disagg") or {})
        if not disagg.get("kv_transfer_address"):
            disagg["kv_transfer_address"] = f"tcp://{host}:0"  # reachable from other nodes
        if disagg.get("kv_events_address", "tcp://127.0.0.1:0") == "tcp://127.0.0.1:0":
            disagg["kv_events_address"] = f"tcp://{host}:0"  # the router may be elsewhere
        engine["disagg"] = disagg
        process = dataclasses.replace(process, engine_config=engine)
        self.spec = WorkerSpec(data["role"], server, process)
        self.proc = start_worker_process(self.spec, log_level)

    def url(self) -> str:
        from cadence.disagg.launcher import wait_healthy

        wait_healthy(self.spec.url, lambda: self.proc.poll() is None)
        return self.spec.url

    def pid(self) -> int:
        return self.proc.pid

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def stop(self) -> None:
        from cadence.disagg.launcher import stop_processes

        stop_processes([self.proc])


@dataclasses.dataclass
class RayWorker:
    actor: Any
    url: str
    role: str


def start_ray_workers(specs: list[WorkerSpec], log_level: str = "warning",
                      bind_host: str | None = None, num_cpus: float = 1.0,
                      resource: str | None = None) -> list[RayWorker]:
    """One actor per spec (each asking Ray for `num_cpus`, and one unit of the custom node
    resource `resource` if given: a node started with `ray start --resources
    '{"NAME": k}'` takes at most k workers); returns once all are healthy. Actors are spread
    over the nodes (Ray's SPREAD strategy): replicas on different nodes do not share cores.
    Joins the cluster at RAY_ADDRESS, or starts a local one, unless Ray is initialized."""
    import json

    ray = _require_ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    options: dict[str, Any] = {"num_cpus": num_cpus, "scheduling_strategy": "SPREAD"}
    if resource:
        options["resources"] = {resource: 1}
    actor_cls = ray.remote(_WorkerActor).options(**options)
    actors = []
    for spec in specs:
        spec_json = json.dumps({**json.loads(spec.to_json(log_level)), "role": spec.role})
        actors.append((actor_cls.remote(spec_json, bind_host, log_level), spec.role))
    urls = ray.get([actor.url.remote() for actor, _ in actors])
    return [RayWorker(actor, url, role) for (actor, role), url in zip(actors, urls)]


def stop_ray_workers(workers: list[RayWorker]) -> None:
    if not workers:
        return
    ray = _require_ray()
    ray.get([w.actor.stop.remote() for w in workers], timeout=60)
    for w in workers:
        ray.kill(w.actor)
