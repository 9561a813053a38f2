"""torchrun's rendezvous: how the nodes of a multi-node job find each other, and which cells a node runs."""

from __future__ import annotations

from dataclasses import dataclass

from ditbench.errors import UserError


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's rendezvous options: how the nodes of a multi-node job find each other."""

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None  # host:port of the c10d store (any one node, usually node 0)
    run_id: str | None = None  # shared by every node of one job; derived from the cell if not given

    def validate(self) -> None:
        if self.nnodes < 1:
            raise UserError(f"--nnodes {self.nnodes} must be at least 1.")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(
                f"--node-rank {self.node_rank} must be between 0 and nnodes-1 ({self.nnodes - 1})."
            )
        if self.nnodes > 1 and not self.endpoint:
            raise UserError(
                f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT, an address every node can reach "
                "(usually node 0's hostname and a free port, e.g. node0:29500)."
            )
        if self.endpoint and ":" not in self.endpoint:
            raise UserError(f"--rdzv-endpoint {self.endpoint!r} must be HOST:PORT, e.g. node0:29500.")


def node_verdict(config: dict, rdzv: Rendezvous) -> tuple[str, str] | None:
    """(status, reason) for a cell this node must not start in a multi-node run, else None.

    Every node runs the same suite in the same order. A cell spanning all nodes runs on each of
    them (torchrun joins them); a one-node cell runs on node 0 only, so it is measured once.
    """
    nodes = int(config.get("nodes", 1))
    if nodes == rdzv.nnodes:
        return None
    if nodes == 1:
        if rdzv.node_rank == 0:
            return None
        return "skipped", f"a one-node cell: node 0 of this {rdzv.nnodes}-node run measures it"
    return "unsupported", (
        f"the cell needs nodes={nodes}, but this run was started with --nnodes "
        f"{rdzv.nnodes}; start it on {nodes} nodes with --nnodes {nodes}"
    )


def add_rendezvous_arguments(parser) -> None:
    """torchrun's rendezvous options, for `ditbench run` (several machines run one multi-node cell)."""
    g = parser.add_argument_group("multi-node (passed to torchrun)")
    g.add_argument("--nnodes", type=int, default=1, help="number of machines in the job")
    g.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0..nnodes-1")
    g.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT every node can reach (usually node 0)")
    g.add_argument("--rdzv-id", default=None, help="job id shared by all nodes (default: per cell)")


def rendezvous_from_args(args) -> Rendezvous:
    rdzv = Rendezvous(
        nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint, run_id=args.rdzv_id
    )
    rdzv.validate()
    return rdzv
