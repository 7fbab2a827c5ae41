"""Communication volume and time: the formulas that chapter 4 derives and then measures.

Conventions (the same as nccl-tests and the ZeRO paper):

* ``nbytes`` of a collective is the size of the *full* tensor: the buffer being all-reduced, the
  output of an all-gather, the input of a reduce-scatter.
* The volume of a collective is what **one rank sends** (and, by symmetry, receives) under the
  ring algorithm: ``2(N-1)/N * nbytes`` for AllReduce, ``(N-1)/N * nbytes`` for AllGather and
  ReduceScatter. The busbw factors of nccl-tests are exactly these ratios.
* Per-step volumes assume parameter, gradient and communication dtypes are the same and that
  sizes divide evenly by the number of ranks (FSDP pads otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .checks import int_at_least, non_negative, one_of

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
STRATEGIES = ("DDP", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth (busbw = algbw * factor)."""
    int_at_least("world_size", world_size)
    n = world_size
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
    }
    one_of("collective", collective, factors)
    return factors[collective]


def ring_bytes(collective: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends (and receives) in a ring ``collective`` on a ``nbytes`` tensor."""
    non_negative("nbytes", nbytes)
    if collective in ("broadcast", "reduce"):
        # A pipelined ring broadcast/reduce moves the whole buffer through every rank once.
        int_at_least("world_size", world_size)
        return float(nbytes) if world_size > 1 else 0.0
    return busbw_factor(collective, world_size) * nbytes


def bus_bandwidth(collective: str, nbytes: float, seconds: float, world_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in bytes/s, as nccl-tests report them, for one timed collective."""
    if seconds <= 0:
        raise ValueError(f"seconds phải dương, nhận được {seconds!r}.")
    algbw = nbytes / seconds
    return algbw, algbw * busbw_factor(collective, world_size)


def alpha_beta_time(collective: str, nbytes: float, world_size: int, alpha: float,
                    bandwidth: float) -> float:
    """Ring time in seconds: ``steps * alpha + ring_bytes / bandwidth``.

    ``alpha`` is the latency of one message (s), ``bandwidth`` the link bandwidth (bytes/s). A
    ring AllReduce takes ``2(N-1)`` steps, AllGather and ReduceScatter ``N-1``.
    """
    if alpha < 0 or bandwidth <= 0:
        raise ValueError(f"cần alpha >= 0 và bandwidth > 0, nhận được {alpha!r}, {bandwidth!r}.")
    n = world_size
    steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1,
             "all_to_all": n - 1, "broadcast": n - 1, "reduce": n - 1}
    one_of("collective", collective, steps)
    return steps[collective] * alpha + ring_bytes(collective, nbytes, n) / bandwidth


@dataclass(frozen=True)
class StepVolume:
    """Bytes one rank sends in one training step, split by collective and pass."""

    all_gather_forward: float = 0.0
    all_gather_backward: float = 0.0
    reduce_scatter: float = 0.0
    all_reduce: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def ddp_step_bytes(grad_bytes: float, world_size: int) -> StepVolume:
    """DDP: one ring AllReduce of all gradients per step (the buckets add up to all of them)."""
    return StepVolume(all_reduce=ring_bytes("all_reduce", grad_bytes, world_size))


def fsdp_step_bytes(param_bytes: float, world_size: int, strategy: str = "FULL_SHARD", *,
                    root_bytes: float = 0.0, shard_size: int | None = None) -> StepVolume:
    """FSDP's per-rank volume for one step (forward, backward, gradient reduction).

    ``root_bytes``: parameters that belong to the root unit itself. Both FSDP1 and FSDP2 keep the
    root unsharded between forward and backward (it is needed again at once), so these bytes
    skip the backward AllGather.
    ``shard_size``: for ``HYBRID_SHARD``, the ranks of one shard group (usually GPUs per node);
    parameters are fully sharded inside it and replicated across ``world_size // shard_size``
    groups, whose gradient shards are then all-reduced.
    """
    non_negative("param_bytes", param_bytes)
    int_at_least("world_size", world_size)
    one_of("strategy", strategy, STRATEGIES)
    if not 0 <= root_bytes <= param_bytes:
        raise ValueError(f"root_bytes phải nằm trong [0, param_bytes], nhận được {root_bytes!r}.")
    if strategy in ("DDP", "NO_SHARD"):
        return ddp_step_bytes(param_bytes, world_size)
    replicas = 1
    if strategy == "HYBRID_SHARD":
        if shard_size is None or world_size % shard_size:
            raise ValueError(
                f"HYBRID_SHARD cần shard_size chia hết world_size={world_size}, "
                f"nhận được shard_size={shard_size!r}."
            )
        int_at_least("shard_size", shard_size)
        replicas = world_size // shard_size
    group = shard_size if strategy == "HYBRID_SHARD" else world_size
    regather = 0.0 if strategy == "SHARD_GRAD_OP" else param_bytes - root_bytes
    return StepVolume(
        all_gather_forward=ring_bytes("all_gather", param_bytes, group),
        all_gather_backward=ring_bytes("all_gather", regather, group),
        reduce_scatter=ring_bytes("reduce_scatter", param_bytes, group),
        all_reduce=ring_bytes("all_reduce", param_bytes / group, replicas),
    )


def naive_all_reduce_bytes(nbytes: float, world_size: int) -> float:
    """Bytes rank 0 sends (and, as much, receives) when every rank sends its whole buffer to
    rank 0, which sums and sends the result back: ``(N-1) * nbytes``, growing with N."""
    non_negative("nbytes", nbytes)
    int_at_least("world_size", world_size)
    return (world_size - 1) * nbytes


def internode_bytes(volume: StepVolume, strategy: str, nodes: int, gpus_per_node: int) -> float:
    """Bytes one node sends to the other nodes in one step of ``volume`` (one rank's sends),
    under the ring model with ranks ordered node by node. A ring over every rank crosses each
    node boundary once, and that link carries what one rank sends: ``volume.total``.
    HYBRID_SHARD keeps its AllGathers and ReduceScatters inside the node; only the AllReduce of
    the replica groups crosses, one ring per position in the node (``gpus_per_node`` rings, each
    rank sending ``volume.all_reduce``). Per *node*, not per GPU: that is the network's load."""
    int_at_least("nodes", nodes)
    int_at_least("gpus_per_node", gpus_per_node)
    if nodes == 1:
        return 0.0
    if strategy == "HYBRID_SHARD":
        return gpus_per_node * volume.all_reduce
    return volume.total


@dataclass(frozen=True)
class ServerVolume:
    """Bytes one node sends (and, as much, receives) in one synchronous step with dedicated
    parameter servers: each of ``num_servers`` servers owns ``1/num_servers`` of the buffer."""

    worker: float  # a worker pushes its whole gradient and pulls the whole update
    server: float  # a server gets its shard from every worker and sends it back to each

    @property
    def busiest(self) -> float:
        return max(self.worker, self.server)


def parameter_server_bytes(nbytes: float, world_size: int, num_servers: int = 1) -> ServerVolume:
    """Parameter-server step with ``world_size`` workers and ``num_servers`` separate servers.

    A worker sends ``nbytes`` (its gradient, split over the servers) and receives ``nbytes``;
    a server receives ``world_size`` shards of ``nbytes / num_servers`` and sends as much back.
    With one server this is the naive scheme's load, ``N * nbytes``, on a machine of its own.
    """
    non_negative("nbytes", nbytes)
    int_at_least("world_size", world_size)
    int_at_least("num_servers", num_servers)
    return ServerVolume(worker=float(nbytes), server=world_size * nbytes / num_servers)


ROOTED = ("broadcast", "reduce")
ROUTES = ("chain", "star")


@dataclass(frozen=True)
class RankTraffic:
    """Bytes each rank sends and receives in one collective; index ``k`` is rank ``k``."""

    sent: tuple[float, ...]
    received: tuple[float, ...]

    @property
    def traffic(self) -> tuple[float, ...]:
        """Bytes in + out of each rank."""
        return tuple(s + r for s, r in zip(self.sent, self.received))


def rooted_links(collective: str, world_size: int, route: str = "chain") -> list[tuple[int, int]]:
    """The (source, destination) pairs of a Broadcast from rank 0 or a Reduce onto rank 0.

    ``route="chain"``: NCCL's pipelined ring with the ranks in index order. Broadcast runs
    0 -> 1 -> ... -> N-1; Reduce runs 1 -> 2 -> ... -> N-1 -> 0, the ring ending at the root.
    NCCL picks the real order from the topology (NVLink first).
    ``route="star"``: a direct copy between the root and each other rank, what
    ``torch.nn.parallel.comm`` does without NCCL."""
    one_of("collective", collective, ROOTED)
    one_of("route", route, ROUTES)
    int_at_least("world_size", world_size)
    n = world_size
    if route == "star":
        pairs = [(0, k) for k in range(1, n)]
        return pairs if collective == "broadcast" else [(k, 0) for _, k in pairs]
    if collective == "broadcast":
        return [(k, k + 1) for k in range(n - 1)]
    return [(k, (k + 1) % n) for k in range(1, n)]


def rooted_bytes(collective: str, nbytes: float, world_size: int,
                 route: str = "chain") -> RankTraffic:
    """Per-rank bytes of a Broadcast from rank 0, or a Reduce onto rank 0, of ``nbytes``, over
    ``rooted_links``. On the chain every link used carries the buffer once: no rank sends or
    receives more than ``nbytes`` (``ring_bytes``). On the star the root sends (Broadcast) or
    receives (Reduce) ``(N-1) * nbytes`` (``naive_all_reduce_bytes``)."""
    non_negative("nbytes", nbytes)
    links = rooted_links(collective, world_size, route)
    sent, received = [0.0] * world_size, [0.0] * world_size
    for src, dst in links:
        sent[src] += float(nbytes)
        received[dst] += float(nbytes)
    return RankTraffic(tuple(sent), tuple(received))


# --- one step on nodes x GPUs: communication time with separate intra- and inter-node links

@dataclass(frozen=True)
class StepTime:
    """Alpha-beta time of one training step, in seconds (``step_time``)."""

    comm_seconds: float  # every collective of the step, one after another (one stream)
    serial_seconds: float  # compute, then all the communication: nothing overlaps
    overlap_seconds: float  # the lower bound of 4.1.4 with equal pieces


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} phải là số dương, nhận được {value!r}.")


def step_time(param_bytes: float, strategy: str, nodes: int, gpus_per_node: int, *,
              compute_seconds: float, messages: int = 1, alpha_intra: float,
              bandwidth_intra: float, alpha_inter: float, bandwidth_inter: float,
              root_bytes: float = 0.0) -> StepTime:
    """Alpha-beta time of one step of ``strategy`` on ``nodes`` x ``gpus_per_node`` ranks.

    The bytes are ``fsdp_step_bytes`` (``ddp_step_bytes`` for DDP and NO_SHARD; HYBRID_SHARD
    with one node as the shard group). Each collective of the step runs as a ring: ``steps``
    messages (``2(n-1)`` for AllReduce, ``n-1`` for AllGather and ReduceScatter over ``n``
    ranks), each costing a latency, and the bytes one rank sends (``v``) at the speed of the
    slowest link. A ring inside one node pays ``alpha_intra`` per message and moves ``v`` at
    ``bandwidth_intra`` (per GPU, per direction). A ring that crosses nodes pays
    ``alpha_inter`` and is as fast as its slowest link: ``max(v / bandwidth_intra,
    v_node / bandwidth_inter)``, where ``v_node`` is what one node sends to the others
    (``internode_bytes``: ``v`` for a ring over every rank, ``gpus_per_node * v`` for
    HYBRID_SHARD's AllReduces, whose rings share the node's network) and ``bandwidth_inter``
    the node's network bandwidth (per node, per direction). A collective of zero bytes is not
    issued (SHARD_GRAD_OP's backward AllGather).

    ``messages``: each collective is issued in that many equal pieces (DDP's buckets, FSDP's
    units), each paying its own latency. ``compute_seconds``: the compute the communication
    can hide behind. ``serial_seconds = compute + comm``; ``overlap_seconds`` is the bound of
    section 4.1.4, ``max(T_c + T_last, sum_k T_k)``, with the last piece ``comm / messages``:
    at best every piece but the last hides behind compute. Perfect overlap is assumed (no
    slowdown of compute by communication kernels), as in ``overlap.alpha_beta_timeline``.
    """
    int_at_least("nodes", nodes)
    int_at_least("gpus_per_node", gpus_per_node)
    one_of("strategy", strategy, STRATEGIES)
    non_negative("compute_seconds", compute_seconds)
    int_at_least("messages", messages)
    non_negative("alpha_intra", alpha_intra)
    _positive("bandwidth_intra", bandwidth_intra)
    non_negative("alpha_inter", alpha_inter)
    _positive("bandwidth_inter", bandwidth_inter)
    world = nodes * gpus_per_node
    hybrid = strategy == "HYBRID_SHARD"
    volume = fsdp_step_bytes(param_bytes, world, strategy, root_bytes=root_bytes,
                             shard_size=gpus_per_node if hybrid else None)
    group = gpus_per_node if hybrid else world  # the AllGathers' and ReduceScatter's ranks
    rings = (  # (bytes one rank sends, ring messages, crosses nodes, rings sharing a NIC)
        (volume.all_gather_forward, group - 1, nodes > 1 and not hybrid, 1),
        (volume.all_gather_backward, group - 1, nodes > 1 and not hybrid, 1),
        (volume.reduce_scatter, group - 1, nodes > 1 and not hybrid, 1),
        (volume.all_reduce, 2 * ((nodes if hybrid else world) - 1), nodes > 1,
         gpus_per_node if hybrid else 1),
    )
    comm = 0.0
    for v, steps, crosses, shared in rings:
        if v == 0:
            continue
        if crosses:
            comm += messages * steps * alpha_inter + max(v / bandwidth_intra,
                                                         shared * v / bandwidth_inter)
        else:
            comm += messages * steps * alpha_intra + v / bandwidth_intra
    return StepTime(comm_seconds=comm, serial_seconds=compute_seconds + comm,
                    overlap_seconds=max(compute_seconds + comm / messages, comm))
