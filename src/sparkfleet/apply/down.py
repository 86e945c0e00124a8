"""``down``: stop a recorded deployment's own instance on every node; ``down --sweep``: find a
deployment's ranks by name on a cluster, whoever started them, and stop them."""

from __future__ import annotations

from sparkfleet.apply.stopping import stop_ranks
from sparkfleet.errors import SparkfleetError
from sparkfleet.nodes.fanout import fan_out, raise_first
from sparkfleet.nodes.identity import FoundRank
from sparkfleet.nodes.runtime.docker import DockerRuntime
from sparkfleet.nodes.runtime.process import ProcessRuntime
from sparkfleet.nodes.transport import Connector, transport_for
from sparkfleet.spec.cluster import Cluster
from sparkfleet.state.deployments import Deployment, Deployments


def down(deployment: Deployment, *, deployments: Deployments | None = None,
         accept_new_host_keys: bool = False, connect: Connector | None = None) -> list[str]:  # fmt: skip
    """Stop every rank of a recorded deployment's own instance (idempotent); returns what was stopped."""
    records = deployments or Deployments()
    connect = connect or (lambda n: transport_for(n, accept_new_host_keys=accept_new_host_keys))
    transports = {r.node.name: connect(r.node) for r in deployment.ranks}
    records.set_status(deployment.name, "stopping")
    result = stop_ranks(deployment.ranks, transports, deployment.name, deployment.instance)
    stopped = result.stopped
    errors = [f"{n}: {e}" for n, e in result.failed.items()]
    if errors:
        records.event(deployment.name, "down-failed", "; ".join(errors))
        raise SparkfleetError(f"{deployment.name}: could not stop every rank: " + "; ".join(errors))
    records.set_status(deployment.name, "stopped")
    records.event(deployment.name, "down", f"stopped {len(stopped)} container(s)/process(es)")
    return stopped


def find_by_name(cluster: Cluster, name: str) -> list[FoundRank]:
    """Every rank of any instance of deployment name on every node of cluster, with its owner
    (what ``down --sweep`` lists before it stops anything)."""

    def look(node_name: str) -> list[FoundRank]:
        node = cluster.node(node_name)
        transport = transport_for(node)
        return DockerRuntime().find(transport, name, node) + ProcessRuntime().find(transport, name, node)

    return [f for found in raise_first(fan_out([n.name for n in cluster.nodes], look)).values() for f in found]


def sweep(cluster: Cluster, found: list[FoundRank]) -> None:
    """Stop what find_by_name found, whoever started it."""

    def clean(node_name: str) -> None:
        node = cluster.node(node_name)
        transport = transport_for(node)
        mine = [f for f in found if f.node == node_name]
        DockerRuntime().remove(transport, mine, node)
        ProcessRuntime().remove(transport, mine, node)

    raise_first(fan_out(sorted({f.node for f in found}), clean))
