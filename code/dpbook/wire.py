"""Bytes on the wire of a gloo rank, measured, and the model they are checked against.

* ``WireBytes``: bytes measured where they travel on a gloo rank, from the kernel's counters of
  this process's own TCP connections (``TCP_INFO``); ``store_barrier`` makes every byte of a
  step written before the counters are read.
* ``gloo_wire_bytes`` / ``gloo_step_wire``: gloo's algorithms as its source writes them, message
  headers included, for one collective (a ``measure.CommRecord``) or a step's records.

``measure`` re-exports every public name here (``from dpbook.measure import WireBytes`` works).
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
import sys
import termios
import time
from dataclasses import dataclass

import torch.distributed as dist

# --- Bytes on the wire: the kernel's TCP counters of this process's own sockets --------------

# Byte offsets in ``struct tcp_info`` (Linux ``include/uapi/linux/tcp.h``), checked with
# ``offsetof`` against the header and by a known-size send over loopback TCP (the tests).
TCPI_BYTES_ACKED = 120  # __u64 tcpi_bytes_acked: data bytes the peer acknowledged (Linux 4.1+)
TCPI_BYTES_RECEIVED = 128  # __u64 tcpi_bytes_received: data bytes received (Linux 4.1+)
TCPI_BYTES_SENT = 200  # __u64 tcpi_bytes_sent: transmitted, retransmissions too (Linux 4.19+)
_TCP_LISTEN = 10  # tcpi_state (offset 0) of a listening socket: it carries no data


@dataclass(frozen=True)
class WireCount:
    """TCP payload bytes (no TCP/IP headers) one rank sent and received on its connections."""

    sent: int
    received: int
    connections: int = 0  # TCP connections counted

    def __add__(self, other: "WireCount") -> "WireCount":
        return WireCount(self.sent + other.sent, self.received + other.received,
                         max(self.connections, other.connections))


def store_ports() -> set[int]:
    """Ports of a ``TCPStore`` this process talks to (``MASTER_PORT``, the default group's
    store): their connections carry rendezvous traffic, not collectives, and are left out."""
    ports = {int(os.environ["MASTER_PORT"])} if os.environ.get("MASTER_PORT", "").isdigit() else set()
    if dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        while store is not None and not isinstance(store, dist.TCPStore):
            store = getattr(store, "underlying_store", None)
        if store is not None:
            ports.add(store.port)
    return ports


def _socket_fds():
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            yield int(name), target


_CONSISTENT_READS = 100


def _out_queue(sock: socket.socket) -> int:
    """Bytes written to ``sock`` that the peer has not acknowledged yet (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


def _connection(fd: int, skip_ports: set[int]) -> tuple[int, int, int] | None:
    """``(bytes acknowledged by the peer, bytes written but not yet acknowledged (SIOCOUTQ),
    bytes received)`` of the TCP connection behind ``fd``, or None when it is not one to count
    (a Unix socket, a listening socket, a connection to a store)."""
    # A default socket timeout would make the new object set O_NONBLOCK, a flag the duplicate
    # shares with the original: then put the original's flags back.
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL) if socket.getdefaulttimeout() is not None else None
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:  # closed meanwhile
        return None
    if flags is not None:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    with sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return None
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) < TCPI_BYTES_RECEIVED + 8 or info[0] == _TCP_LISTEN:
                return None
            if {sock.getsockname()[1], sock.getpeername()[1]} & skip_ports:
                return None
            # acknowledged + queued is every byte written only when both are read at one
            # moment: an ACK landing between the two reads leaves its bytes out of both (a
            # 48-byte message of the previous step then counted in this one, once in CI). The
            # queue read on both sides of TCP_INFO and equal: no ACK landed in between.
            for _ in range(_CONSISTENT_READS):
                queued = _out_queue(sock)
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                if _out_queue(sock) == queued:
                    break
        except OSError:
            return None
    acked, received = struct.unpack_from("QQ", info, TCPI_BYTES_ACKED)
    return acked, queued, received


def tcp_snapshot(skip_ports: set[int] | None = None) -> dict[str, tuple[int, int, int]]:
    """``{socket inode: (acknowledged, queued, received)}`` bytes of this process's TCP
    connections (``store_ports`` left out unless ``skip_ports`` is given)."""
    skip = store_ports() if skip_ports is None else skip_ports
    out = {}
    for fd, inode in _socket_fds():
        counters = _connection(fd, skip)
        if counters is not None:
            out[inode] = counters
    return out


def wire_unavailable() -> str | None:
    """Why this rank's bytes cannot be counted on its sockets, or None when they can."""
    if not sys.platform.startswith("linux"):
        return f"đếm byte trên socket cần TCP_INFO của Linux; hệ điều hành này là {sys.platform}."
    if dist.is_available() and dist.is_initialized() and dist.get_backend() != "gloo":
        return (f"backend {dist.get_backend()} không gửi dữ liệu qua socket TCP của process "
                "(NVLink, PCIe, InfiniBand): con số hiển thị là công thức vòng, còn "
                "`make gpu-check` đo băng thông bus bằng thời gian.")
    return None


class WireBytes:
    """``with WireBytes() as wire: ...`` then ``wire.count``: a ``WireCount`` of the TCP bytes
    this process sent and received inside the block (on a gloo rank: every collective's
    traffic, message headers included), or None where that cannot be counted (``wire.why``).

    On exit it waits (at most ``settle`` seconds) until the peers have acknowledged every byte
    written, so the count is of bytes delivered; bytes still queued after that are counted as
    sent. A connection opened inside the block counts from zero; if one open on entry has closed
    by the exit (a peer that left: synchronise the ranks after the block, before they tear down
    their groups), its bytes are lost and ``count`` is None. Connections to a ``TCPStore``
    (``store_ports``) are left out.
    """

    def __init__(self, settle: float = 5.0) -> None:
        self.settle = settle
        self.count: WireCount | None = None
        self.why: str | None = None

    def __enter__(self) -> "WireBytes":
        self.why = wire_unavailable()
        if self.why is None:
            self._skip = store_ports()
            self._start = tcp_snapshot(self._skip)
        return self

    def _settled(self) -> dict[str, tuple[int, int, int]]:
        # Nothing left in the send queues, and no counter moving for 20 ms: gloo's event-loop
        # thread writes some messages after the call that asked for them has returned.
        deadline, pause, last = time.monotonic() + self.settle, 0.0005, None
        while True:
            end = tcp_snapshot(self._skip)
            idle = not any(queued for _, queued, _ in end.values())
            if (idle and end == last) or time.monotonic() > deadline:
                return end
            last = end if idle else None
            time.sleep(0.02 if idle else pause)
            pause = min(2 * pause, 0.05)

    def __exit__(self, *exc) -> None:
        if self.why is not None:
            return
        end = self._settled()
        if set(self._start) - set(end):
            # A connection closed inside the block took its counters with it (a peer that left
            # early: synchronise the ranks after the block, before any of them tears down).
            self.why = "một kết nối TCP đã đóng trong lúc đo: số byte của nó không còn đọc được."
            return
        sent = received = 0
        for inode, (acked, queued, got) in end.items():
            acked0, queued0, got0 = self._start.get(inode, (0, 0, 0))
            sent += (acked + queued) - (acked0 + queued0)
            received += got - got0
        self.count = WireCount(sent, received, len(end))


# --- What gloo puts on the wire: a model read from gloo's source ------------------------------

# gloo/transport/tcp/pair.h, ``Op::preamble``: six size_t before every message. A send of L
# bytes (pair.cc, ``Pair::send``) writes NOTIFY_SEND_READY (a preamble) and, once the peer has
# posted its receive and said so with NOTIFY_RECV_READY (a preamble), SEND_UNBOUND_BUFFER (a
# preamble and the L bytes). So a sender writes 96 + L bytes, the receiver 48.
GLOO_PREAMBLE = 48
GLOO_MAX_SEGMENT = 1 << 20  # gloo/allreduce.h, AllreduceOptionsImpl::kMaxSegmentSize


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def gloo_ring_allreduce(nbytes: int, world_size: int, rank: int, element_size: int = 4):
    """Payload lengths rank ``rank`` sends and receives in gloo's ``allreduce`` (gloo/allreduce.cc,
    ``ring``): the buffer cut into ``world_size * k`` segments of at most 1 MiB (at least two per
    rank), a reduce-scatter pass then an allgather pass around the ring, each forwarding all but
    the rank's own segments; segments past the end of the buffer are shorter or skipped."""
    n = world_size
    max_seg = element_size * max(1, GLOO_MAX_SEGMENT // element_size)
    segments = _round_up(max(-(-nbytes // max_seg), 2 * n), n)
    per_rank = segments // n
    seg = _round_up(-(-nbytes // segments), element_size)
    span = segments * seg
    sends, recvs = [], []
    for send_first, recv_first in ((rank + 1, rank + 2), (rank, rank + 1)):  # the two passes
        for i in range(segments - per_rank):
            for first, out in ((send_first, sends), (recv_first, recvs)):
                length = min(seg, nbytes - ((first * per_rank + i) * seg) % span)
                if length > 0:
                    out.append(length)
    return sends, recvs


def gloo_ring_allgather(out_bytes: int, world_size: int):
    """gloo/allgather.cc, ``allgather``: each rank's block split in two halves, 2 (N-1) sends
    and receives around the ring."""
    block = out_bytes // world_size
    halves = [block // 2, block - block // 2]
    lengths = [halves[i % 2] for i in range(2 * (world_size - 1))]
    return lengths, list(lengths)


def gloo_broadcast(nbytes: int, world_size: int, rank: int, root: int = 0):
    """gloo/broadcast.cc, ``broadcast``: a binomial tree from ``root``."""
    vrank = (rank - root) % world_size
    dim = max(1, (world_size - 1).bit_length())
    mask, sends, recvs = (1 << dim) - 1, [], []
    for i in range(dim):
        mask ^= 1 << i
        if vrank & mask or (vrank ^ (1 << i)) >= world_size:
            continue
        (recvs if vrank & (1 << i) else sends).append(nbytes)
    return sends, recvs


def gloo_wire_bytes(record, rank: int = 0, header: int = GLOO_PREAMBLE) -> WireCount:
    """What rank ``rank`` (its index in the record's group) puts on and takes off its sockets for
    one collective (a ``measure.CommRecord``: its ``op``, ``nbytes``, ``group_size`` and
    ``element_size``) under ProcessGroupGloo: gloo's algorithm plus its message headers
    (``header=0``: the tensor data alone). On gloo a
    ReduceScatter is an AllReduce of the whole input followed by a local slice
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, ``reduce_scatter_tensor_coalesced``)."""
    n, size = record.group_size, record.nbytes
    if n == 1:
        return WireCount(0, 0)
    if record.op in ("allreduce_", "allreduce_coalesced_", "_reduce_scatter_base_"):
        sends, recvs = gloo_ring_allreduce(size, n, rank, record.element_size)
    elif record.op in ("_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_"):
        sends, recvs = gloo_ring_allgather(size, n)
    elif record.op == "broadcast_":
        sends, recvs = gloo_broadcast(size, n, rank)
    else:
        raise ValueError(f"chưa có mô hình gloo cho toán tử {record.op!r}; có cho allreduce_, "
                         "allreduce_coalesced_, _reduce_scatter_base_, _allgather_base_, "
                         "allgather_, allgather_into_tensor_coalesced_, broadcast_.")
    return WireCount(sum(sends) + 2 * header * len(sends) + header * len(recvs),
                     sum(recvs) + 2 * header * len(recvs) + header * len(sends))


def gloo_step_wire(records, rank: int = 0, header: int = GLOO_PREAMBLE) -> WireCount:
    """``gloo_wire_bytes`` summed over the collectives of a step (``CommLog.records``)."""
    total = WireCount(0, 0)
    for r in records:
        index = r.group_ranks.index(rank) if rank in r.group_ranks else rank
        total = total + gloo_wire_bytes(r, index, header)
    return WireCount(total.sent, total.received)


_STORE_BARRIERS = iter(range(1 << 62))  # the same sequence on every rank: one key per barrier


def store_barrier(timeout: float = 300.0) -> None:
    """Wait until every rank has reached this point, through the group's store, not its
    sockets: launch's FileStore, or a TCPStore whose port ``WireBytes`` leaves out.

    Why ``WireBytes`` needs it: gloo writes a send's data only when the peer has posted the
    matching receive (``Pair::send``/``NOTIFY_RECV_READY`` in gloo's tcp transport), on its
    event-loop thread, and a collective can return before its last send is written. Read at
    once, the counters missed a whole last send (5 672 B of DDP's 11 728 at N = 2) in 2 of 432
    readings under load, or counted the previous step's. A peer that reached this point has
    received everything this rank sent it, so every byte is written."""
    store = dist.distributed_c10d._get_default_store()
    key, rank = f"dpbook_store_barrier/{next(_STORE_BARRIERS)}", dist.get_rank()
    store.set(f"{key}/{rank}", "1")
    store.wait([f"{key}/{r}" for r in range(dist.get_world_size())],
               datetime.timedelta(seconds=timeout))
