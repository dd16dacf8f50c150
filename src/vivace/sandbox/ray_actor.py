"""One environment server per node of a Ray cluster, each in a Ray actor pinned to its node.

`start_env_servers(config)` places an `EnvServerActor` on every alive node (hard node
affinity); each actor opens the configured backend on its node and serves it with uvicorn
in a background thread of the actor process, then reports its real URL (port 0 works).
All servers share one token, resolved once in the driver. Ray is imported only when used.

Not guaranteed: reachability across nodes -- with the default host 127.0.0.1 a server
answers only clients on its own node (place rollout workers beside it, or configure host
0.0.0.0, in which case the URL names the node's IP; there is no TLS). Nodes joining later
get no server until `start_env_servers` runs again, and an actor that dies is not
restarted (the next backend on that node sweeps what it left).
"""

from __future__ import annotations

import functools
from typing import Any

import httpx

from vivace.config import VivaceConfig


class EnvServerActor:
    """The actor's body; wrapped with `ray.remote` by `actor_class()`."""

    def __init__(self, config: dict[str, Any]) -> None:
        import ray

        from vivace.sandbox.background import BackgroundServer, ClosingServer, http_url
        from vivace.sandbox.pool import open_backend
        from vivace.sandbox.server import GRACEFUL_BACKSTOP_S, configured_limits, create_app, resolve_token

        cfg = VivaceConfig.model_validate(config)
        self._token, _ = resolve_token(cfg.server)
        app = create_app(
            open_backend(cfg.sandbox),
            cfg.pool,
            self._token,
            own_backend=True,
            **configured_limits(cfg.server),
        )
        self._server = BackgroundServer(
            app, cfg.server.host, cfg.server.port, ClosingServer, GRACEFUL_BACKSTOP_S
        ).start()
        self._node_id = ray.get_runtime_context().get_node_id()
        if cfg.server.host in ("0.0.0.0", "::"):  # every interface: name the one Ray uses
            self._url = http_url(ray.util.get_node_ip_address(), self._server.port)  # IPv6 in brackets
        else:
            self._url = self._server.url

    def url(self) -> str:
        return self._url

    def token(self) -> str:
        return self._token

    def node_id(self) -> str:
        return self._node_id

    def metrics(self) -> dict[str, Any]:
        # Through HTTP rather than into the server's event loop: the registry is not thread-safe.
        r = httpx.get(f"{self._server.url}/v1/metrics", headers={"Authorization": f"Bearer {self._token}"}, timeout=30)
        r.raise_for_status()
        return r.json()

    def shutdown(self) -> None:
        """Stop serving and close every workspace (the actor process stays until killed)."""
        self._server.stop()


@functools.cache
def actor_class() -> Any:
    import ray

    # num_cpus=0: the server's real work happens in sandbox processes Ray does not account
    # for, and it must not take a CPU slot away from the rollouts it serves.
    return ray.remote(num_cpus=0)(EnvServerActor)


def start_env_servers(config: VivaceConfig) -> list[tuple[str, Any, str]]:
    """Start one server per alive node; returns (node_id, actor handle, url) per node.

    Keep the handles: Ray ends an actor when its last handle goes away. `ray.init` must
    have been called.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from vivace.sandbox.server import resolve_token

    token, generated = resolve_token(config.server)
    if generated:
        print(f"vivace env servers token: {token}", flush=True)
    data = config.model_dump(mode="json")
    data["server"]["token"] = token  # one token for the whole cluster
    cls = actor_class()
    node_ids = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    actors = [
        cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote(data)
        for node_id in node_ids
    ]
    urls = ray.get([a.url.remote() for a in actors])
    return list(zip(node_ids, actors, urls, strict=True))


def stop_env_servers(servers: list[tuple[str, Any, str]]) -> None:
    """Shut every server down (closing its workspaces), then end the actors."""
    import ray

    ray.get([actor.shutdown.remote() for _, actor, _ in servers])
    for _, actor, _ in servers:
        ray.kill(actor)
