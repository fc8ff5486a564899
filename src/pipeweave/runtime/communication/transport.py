"""Transports: how one rank's sends, receives and all-reduces reach the others.

Two implementations of one small interface, so that one interpreter serves both executors:

* :class:`DistTransport` — torch.distributed point-to-point (gloo on CPU, NCCL on CUDA; gloo
  through host memory for ranks that share a GPU: a CUDA tensor is copied to the host to be
  sent and back to the rank's device on receipt, see ``wire``).
  Sends are ``isend`` (never block the rank); receives can be posted early (``prefetch``) so
  the transfer overlaps with compute. The shape and dtype of each kind of message between two
  ranks are exchanged once, in a small header before the first message of that kind. A sent
  tensor is let go as soon as the schedule proves it delivered (:func:`delivery_proofs`), so
  memory stays flat over any number of iterations and no rank ever waits on a send. Between
  GPUs (NCCL), sends and receives are posted on a CUDA stream of their own and ordered with
  compute by events, never by the host waiting (:mod:`.streams`), and in the schedule's
  message order, which NCCL needs not to deadlock (``rendezvous``, :mod:`..execution.posting`).
* :class:`LocalTransport` — in-memory mailboxes for the single-process executor; a receive
  whose message has not been sent yet *yields*, letting the executor run another rank.

Receives and all-reduces are generators: ``value = yield from transport.recv(...)``. The
distributed one never yields (it blocks in torch.distributed with a timeout).

All-reduce sums contributions in replica order on every rank (all-gather, then an ordered
sum), so results are bit-identical between the executors and across runs.

With ``apc`` on, float32/float64 activations and gradients travel compressed (WPipe's
automatic precision compression, :mod:`.apc`) in one wire format both transports share
(:func:`_pack`, :func:`_unpack`), so the two executors round identically. Both count the bytes
they send point-to-point (``bytes_sent``: headers, APC metadata and payloads; all-reduces not).
"""

from __future__ import annotations

import contextlib
import datetime
import queue
import threading
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from ...ir import CHECK_OPS, Action, Op, Schedule
from ...ir.deliveries import delivery_proofs
from ...apc import MODE_FULL, MODE_HALF, Encoded, decode, encode
from .let_go import LetGo
from .streams import MessageStreams

__all__ = ["Transport", "DistTransport", "LocalTransport", "message_tag", "PeerTimeout",
           "delivery_proofs"]

Waiting = Generator[None, None, Tensor]


class PeerTimeout(RuntimeError):
    """A peer did not answer within the timeout (it probably died)."""


class Transport(Protocol):
    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent point-to-point so far (headers, APC metadata, payloads)."""
        ...

    @property
    def rendezvous(self) -> bool:
        """Whether a send may wait for its receive to run (NCCL): then the interpreter posts
        in the schedule's message order (:mod:`..execution.posting`)."""
        ...

    def send(self, message: Action, tensor: Tensor, dst: int) -> None: ...

    def recv(self, message: Action, src: int) -> Waiting: ...

    def prefetch(self, message: Action, src: int) -> None:
        """Post the receive of ``message`` now (a rendezvous transport must; another may
        decline)."""
        ...

    def all_reduce(self, key: Hashable, flat: Tensor, ranks: Sequence[int]) -> Waiting:
        """The sum of ``flat`` over ``ranks`` (in their order); ``key`` names the collective
        (an ``AR`` action, or any other hashable the ranks agree on)."""
        ...

    def finish(self) -> None: ...


def message_tag(message: Action) -> int:
    """A point-to-point tag unique among the messages that can be in flight between two ranks.

    Packs (micro-batch mod 4096, piece, direction, stage, pipeline mod 16) below
    ``_CHECK_TAGS``; the state of a global check (``C``/``V``: version mod 4096, direction,
    stage) above it, below 2**29.
    """
    if message.op is Op.CHECK or message.op is Op.VALIDATE:
        assert message.version is not None
        direction = 0 if message.op is Op.CHECK else 1
        return _CHECK_TAGS + ((message.version % 4096) * 2 + direction) * 1024 + message.stage
    assert message.microbatch is not None
    direction = 0 if message.op is Op.SEND_ACT else 1
    if message.stage >= 1024:
        raise ValueError(f"stage {message.stage} too large for p2p tags; use fewer than 1024 stages")
    tag = (message.microbatch % 4096) * 3 + message.piece
    tag = (tag * 2 + direction) * 1024 + message.stage
    return tag * 16 + message.pipeline % 16


_CHECK_TAGS = 4096 * 3 * 2 * 1024 * 16
"""First tag of a global check's messages: above every micro-batch message's tag."""


_HEADER_BIT = 1 << 30
_REST_BIT = 1 << 29  # message_tag() stays below 2**29 (at most 411,040,767): both bits are free
_HEADER_LEN = 10  # dtype code, ndim, up to 8 dims
_HEADER_BYTES = _HEADER_LEN * 8
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.bool, torch.uint8, torch.int8]

_Kind = tuple[Op, int, int, int]


def _kind(message: Action, src: int, dst: int) -> _Kind:
    """The channel a message travels on; its shape and dtype are sent once per channel."""
    return (message.op, message.stage, message.piece, src * 65536 + dst)


# -- APC wire format (WPipe §A.3, Fig. 12; the codec is .apc) ----------------------------
#
# A compressed message of a float32/float64 tensor of n elements, s bytes each, is the bytes
#
#     [ mode, exponent: 2 x int64 ][ payload: 2n bytes ][ payload, continued: (s-2)n bytes ]
#     └────────── first part: always sent, tag ─────────┘└─ rest: fallback only, tag|_REST_BIT ┘
#
# When the codec succeeds the payload is the fp16 tensor and the first part is all there is
# (about half the bytes for float32); when it falls back the payload is the tensor itself and
# its remaining bytes follow as a second message. The metadata rides in front of the payload
# rather than in a message of its own, so the receiver posts one buffer of a size it knows
# from the channel's one-time header, early (prefetched) exactly like an uncompressed message;
# a separate meta message would force posting the payload only after the meta arrived (no
# overlap with compute) or posting both sizes (no saving). Only a fallback costs a second,
# unprefetched receive.

_META_BYTES = 16
_COMPRESSIBLE = (torch.float32, torch.float64)


def _compressed(dtype: torch.dtype, apc: bool, message: Action) -> bool:
    """Whether a channel of ``dtype`` uses the APC wire format (other dtypes go as they are,
    and so does a global check's state: APC is for activations and gradients)."""
    return apc and dtype in _COMPRESSIBLE and message.op not in CHECK_OPS


def _wire_sizes(shape: torch.Size, dtype: torch.dtype) -> tuple[int, int]:
    """Bytes of the first part and of the rest of a compressed message."""
    numel = shape.numel()
    itemsize = torch.empty((), dtype=dtype).element_size()
    return _META_BYTES + 2 * numel, (itemsize - 2) * numel


def _pack(tensor: Tensor) -> tuple[Tensor, Tensor | None]:
    """``tensor`` encoded as the first part and, on fallback, the rest (uint8, same device)."""
    encoded = encode(tensor)
    payload = encoded.payload.detach().contiguous().reshape(-1).view(torch.uint8)
    split = 2 * tensor.numel()
    first = torch.empty(_META_BYTES + split, dtype=torch.uint8, device=tensor.device)
    first[:_META_BYTES].view(torch.int64).copy_(
        torch.tensor([encoded.mode, encoded.exponent], device=tensor.device))
    first[_META_BYTES:].copy_(payload[:split])
    rest = payload[split:]
    return first, rest if encoded.mode == MODE_FULL and rest.numel() else None


def _unpack(wire: Tensor, shape: torch.Size, dtype: torch.dtype,
            receive_rest: Callable[[Tensor], None]) -> Tensor:
    """The tensor from a wire buffer (both parts' bytes) whose first part has arrived;
    ``receive_rest(view)`` fills the rest of the buffer when the message fell back."""
    mode, exponent = wire[:_META_BYTES].view(torch.int64).tolist()
    split = _META_BYTES + 2 * shape.numel()
    if mode == MODE_HALF:
        payload = wire[_META_BYTES:split].view(torch.float16).view(shape)
    else:
        assert mode == MODE_FULL, f"corrupt APC metadata: mode {mode}"
        if wire.numel() > split:
            receive_rest(wire[split:])
        payload = wire[_META_BYTES:].view(dtype).view(shape)
    return decode(Encoded(payload, mode, exponent), dtype)


def _nbytes(tensors: Sequence[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class _Send:
    """One message on its way out: the tensors (header first, if any) and their ``Work``."""

    parts: list[tuple[Tensor, int]]  # (tensor, tag)
    dst: int
    issued: threading.Event = field(default_factory=threading.Event)
    works: list[dist.Work] = field(default_factory=list)
    error: BaseException | None = None


def _issue_send(send: _Send) -> None:
    """``isend`` ``send``'s parts (on the helper thread); an error is surfaced on the rank's
    thread by :meth:`DistTransport._settle`."""
    try:
        send.works = [_posted(dist.isend(t, send.dst, tag=tag)) for t, tag in send.parts]
    except BaseException as error:
        send.error = error
    finally:
        send.issued.set()


class _Sender:
    """Issues a CPU rank's sends on a helper thread, so compute never stalls on a send.

    A gloo ``isend`` does part of the transfer in the calling thread, and when the CPUs are
    busy it can stall there: rank timelines showed up to 8 ms per 256 KiB activation send,
    time by which the next forward or backward starts late. Here the rank queues the send and
    goes on computing while the helper absorbs the stall (``isend`` and torch's kernels run
    without the GIL, so the two threads barely contend). Measured on the 2-core benchmark
    machine under load (benchmarks/vs_torch_pipelining.py, gpt 1F1B, 2 ranks): iteration
    time 0.24-0.47 s with the helper against 0.58-0.71 s without, in 4 of 4 paired runs::

        rank:    B(j) | queue SB(j) | F(j+1) ...
        helper:              isend SB(j) (waits for the socket, off the critical path)
    """

    def __init__(self, rank: int) -> None:
        self._queue: queue.SimpleQueue[_Send | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"pipeweave-send-{rank}",
                                        daemon=True)
        self._thread.start()

    def submit(self, send: _Send) -> None:
        self._queue.put(send)

    def _loop(self) -> None:
        while (send := self._queue.get()) is not None:
            _issue_send(send)
            del send  # else it keeps the message's tensors while waiting for the next


    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class DistTransport:
    """Point-to-point over an initialised default process group."""

    def __init__(self, rank: int, device: torch.device, timeout: datetime.timedelta, *,
                 send_thread: bool | None = None, apc: bool = False,
                 wire: torch.device | None = None,
                 streams: MessageStreams | None = None) -> None:
        """``wire``: where messages travel from and arrive (default ``device``); the host
        under gloo, which sends and receives host memory only: a tensor is copied there to be
        sent, and a received one is copied to ``device``. ``send_thread``: issue sends from a
        helper thread (:class:`_Sender`); default when the wire is the host (gloo), where
        ``isend`` can stall the calling thread; off for NCCL, whose sends return at once and
        are ordered on the caller's stream. ``apc``: compress float activations and gradients
        (see the wire format above; encoded on ``device``); every rank must agree.
        ``streams``: post messages on a comm stream ordered by events (:mod:`.streams`);
        made for a CUDA wire (NCCL) when not given, never for the host (gloo)."""
        self.rank = rank
        self.device = device
        self.wire = device if wire is None else wire
        self.timeout = timeout
        self.apc = apc
        self.bytes_sent = 0
        """Bytes sent point-to-point so far: headers, APC metadata and payloads."""
        self._sent_header: set[_Kind] = set()
        self._shapes: dict[_Kind, tuple[torch.Size, torch.dtype]] = {}
        self._in_flight: dict[Action, _Send] = {}
        """Sends (with their header) not yet known to be delivered; they keep their tensors."""
        self._sender: _Sender | None = None
        self.send_thread = self.wire.type == "cpu" if send_thread is None else send_thread
        self._streams = streams if streams is not None else (
            MessageStreams(self.wire) if self.wire.type == "cuda" else None)
        self._proofs: dict[Action, tuple[Action, ...]] = {}
        self._prefetched: dict[Action, tuple[dist.Work, Tensor]] = {}
        self._ready: dict[Action, Tensor] = {}
        """Messages already received whole (APC on NCCL, :meth:`prefetch`)."""
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    @property
    def rendezvous(self) -> bool:
        """NCCL (the comm stream): a large send completes only while its receive runs."""
        return self._streams is not None

    def make_groups(self, groups: Sequence[Sequence[int]]) -> None:
        """Create the replica groups; every rank must call this with the same list."""
        for ranks in groups:
            key = tuple(ranks)
            if len(key) > 1 and key not in self._groups:
                self._groups[key] = dist.new_group(list(key), timeout=self.timeout)

    def group(self, ranks: Sequence[int]) -> dist.ProcessGroup:
        """The group :meth:`make_groups` made for ``ranks`` (a stage's, for FSDP2)."""
        return self._groups[tuple(ranks)]

    def track_deliveries(self, schedule: Schedule, rank: int | None = None) -> None:
        """Release each sent tensor as soon as ``schedule`` proves it delivered.

        Without this (or for sends no later receive proves), sent tensors are kept until
        :meth:`finish`, or until polling reports them complete where the backend supports it.
        ``rank``: the program this process runs, when not its own process rank (tensor
        parallelism, :class:`.mesh.MeshTransport`).
        """
        self._proofs = delivery_proofs(schedule, self.rank if rank is None else rank)

    def send(self, message: Action, tensor: Tensor, dst: int) -> None:
        kind = _kind(message, self.rank, dst)
        tag = message_tag(message)
        if kind not in self._sent_header:
            if tensor.dim() > _HEADER_LEN - 2:
                raise ValueError(f"cannot send a {tensor.dim()}-d tensor; at most {_HEADER_LEN - 2} dims")
            header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
            header[0] = _DTYPES.index(tensor.dtype)
            header[1] = tensor.dim()
            header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
            parts = [(header.to(self.wire), tag | _HEADER_BIT)]
            self._sent_header.add(kind)
        else:
            parts = []
        if _compressed(tensor.dtype, self.apc, message):
            first, rest = _pack(tensor)
            parts.append((first.to(self.wire), tag))
            if rest is not None:
                parts.append((rest.to(self.wire), tag | _REST_BIT))
        else:
            parts.append((tensor.contiguous().to(self.wire), tag))
        self.bytes_sent += _nbytes([t for t, _ in parts])
        earlier = self._in_flight.pop(message, None)
        if earlier is not None:  # sent again (a global check undid what made it): the first
            self._settle(message, earlier)  # copy was received and dropped by now
        send = _Send(parts, dst)
        if self._streams is not None:  # NCCL: on the comm stream, after the compute (.streams)
            send.works = self._streams.send(parts, dst)
            send.issued.set()
        elif self.send_thread:
            if self._sender is None:
                self._sender = _Sender(self.rank)
            self._sender.submit(send)
        else:
            send.works = [_posted(dist.isend(t, dst, tag=tag)) for t, tag in parts]
            send.issued.set()
        self._in_flight[message] = send
        if not self._proofs and len(self._in_flight) > 64:  # no schedule given: poll (NCCL)
            self._in_flight = {m: s for m, s in self._in_flight.items() if not _done(s)}

    def _settle(self, message: Action, send: _Send) -> None:
        """Wait until ``send`` is delivered; its tensors can go afterwards. On the comm
        stream nothing waits: ProcessGroupNCCL keeps a sent tensor until its transfer is done
        (it records it on its own stream, or holds it in the work until the watchdog sees the
        work complete), and a host wait would stall the rank (a dead peer is NCCL's
        watchdog's, :mod:`.streams`)."""
        if self._streams is not None:
            return
        if not send.issued.wait(self.timeout.total_seconds()):
            raise PeerTimeout(f"rank {self.rank}: sending {message} did not start within "
                              f"{self.timeout.total_seconds():.0f} s")
        if send.error is not None:
            raise RuntimeError(f"rank {self.rank}: sending {message} to rank {send.dst} "
                               f"failed: {send.error}") from send.error
        for work in send.works:
            work.wait(self.timeout)

    def _release(self, received: Action) -> None:
        """Drop the sends that ``received`` proves delivered (their ``wait`` returns at once)."""
        for sent in self._proofs.pop(received, ()):
            send = self._in_flight.pop(sent, None)
            if send is not None:
                self._settle(sent, send)

    def _shape(self, message: Action, src: int) -> tuple[torch.Size, torch.dtype]:
        kind = _kind(message, src, self.rank)
        if kind not in self._shapes:
            with self._posting():
                header = torch.zeros(_HEADER_LEN, dtype=torch.int64, device=self.wire)
            work = self._irecv(header, src, message_tag(message) | _HEADER_BIT)
            header = self._arrive(work, header, message, src).cpu()
            ndim = int(header[1])
            self._shapes[kind] = (torch.Size(header[2 : 2 + ndim].tolist()), _DTYPES[int(header[0])])
        return self._shapes[kind]

    def _posting(self) -> contextlib.AbstractContextManager[None]:
        """Where receive buffers are allocated: the comm stream on a GPU wire."""
        return self._streams.posting() if self._streams is not None else contextlib.nullcontext()

    def _irecv(self, buffer: Tensor, src: int, tag: int) -> dist.Work:
        if self._streams is not None:
            return self._streams.recv(buffer, src, tag)
        return _posted(dist.irecv(buffer, src, tag=tag))

    def _arrive(self, work: dist.Work, buffer: Tensor, message: Action, src: int) -> Tensor:
        """``buffer`` once ``work`` has received it: the host waits (gloo) or the compute
        stream does (NCCL, :meth:`.streams.MessageStreams.arrived`)."""
        if self._streams is not None:
            return self._streams.arrived(work, buffer)
        self._wait(work, message, src)
        return buffer

    def _wait(self, work: dist.Work, message: Action, src: int) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as error:
            raise PeerTimeout(
                f"rank {self.rank}: waiting for {message} from rank {src} failed after at most "
                f"{self.timeout.total_seconds():.0f} s; rank {src} probably died or stopped "
                f"({error})"
            ) from error

    def _post(self, message: Action, src: int) -> tuple[dist.Work, Tensor]:
        """Post the receive of ``message`` (its first part, if compressed): work and buffer."""
        shape, dtype = self._shape(message, src)
        with self._posting():
            if _compressed(dtype, self.apc, message):
                first, rest = _wire_sizes(shape, dtype)
                buffer = torch.empty(first + rest, dtype=torch.uint8, device=self.wire)
                target = buffer[:first]
            else:
                buffer = target = torch.empty(shape, dtype=dtype, device=self.wire)
        return self._irecv(target, src, message_tag(message)), buffer

    def prefetch(self, message: Action, src: int) -> None:
        if message in self._prefetched or message in self._ready:
            return
        if self.rendezvous:
            self._post_in_order(message, src)
            return
        if _kind(message, src, self.rank) not in self._shapes:
            return  # the first message of a kind carries its header; receive it in order
        self._prefetched[message] = self._post(message, src)

    def _post_in_order(self, message: Action, src: int) -> None:
        """NCCL: post now, whatever it takes, since the interpreter posts in the schedule's
        message order (:mod:`..execution.posting`) and NCCL matches a pair's operations in
        posting order. The first message of a kind brings its header first (the host waits
        for it, as at the first receive). With APC the whole message is received now: a
        fallback's second part follows the first on the wire, so nothing may be posted
        between them, and whether there is one is known only once the first has arrived."""
        if not self.apc:
            self._prefetched[message] = self._post(message, src)
            return
        work, buffer = self._post(message, src)
        self._ready[message] = self._decompress(message, src, self._arrive(work, buffer, message, src))

    def recv(self, message: Action, src: int) -> Waiting:
        buffer = self._ready.pop(message, None)
        if buffer is None:
            if message in self._prefetched:
                work, buffer = self._prefetched.pop(message)
            else:
                work, buffer = self._post(message, src)
            buffer = self._arrive(work, buffer, message, src)
            if self.apc:
                buffer = self._decompress(message, src, buffer)
        self._release(message)
        return buffer.to(self.device)
        yield  # pragma: no cover  (makes this a generator; it never waits cooperatively)

    def _decompress(self, message: Action, src: int, buffer: Tensor) -> Tensor:
        """The received tensor, from the buffer of its first part (see :func:`_unpack`)."""
        shape, dtype = self._shapes[_kind(message, src, self.rank)]
        if not _compressed(dtype, self.apc, message):
            return buffer

        def receive_rest(rest: Tensor) -> None:
            work = self._irecv(rest, src, message_tag(message) | _REST_BIT)
            self._arrive(work, rest, message, src)

        return _unpack(buffer, shape, dtype, receive_rest)

    def all_reduce(self, key: Hashable, flat: Tensor, ranks: Sequence[int]) -> Waiting:
        group = self._groups[tuple(ranks)]
        own = flat.to(self.wire)
        gathered = [torch.empty_like(own) for _ in ranks]
        if self._streams is not None:  # NCCL: the compute stream waits for the gather
            work = dist.all_gather(gathered, own, group=group, async_op=True)
            assert work is not None
            work.wait()
        else:  # gloo: its thread lets go of the buffers before the rank does (.let_go)
            LetGo(lambda mine, *parts: dist.all_gather(list(parts), mine, group=group,
                                                       async_op=True),
                  own, *gathered).wait(self.timeout)
        total = gathered[0].clone()
        for part in gathered[1:]:
            total += part
        return total.to(self.device)
        yield  # pragma: no cover

    def finish(self) -> None:
        for message, send in self._in_flight.items():
            self._settle(message, send)
        self._in_flight.clear()
        if self._sender is not None:
            sender, self._sender = self._sender, None
            sender.close()


def _done(send: _Send) -> bool:
    return send.issued.is_set() and all(work.is_completed() for work in send.works)


def _posted(work: dist.Work | None) -> dist.Work:
    assert work is not None  # None only for ranks outside the group, never the case here
    return work


class LocalTransport:
    """Mailboxes shared by all ranks of one process (the single-process executor).

    ``apc``: deliver what the distributed transport would — each float message goes through
    the same wire format (:func:`_pack`, :func:`_unpack`) — and count the same bytes.
    """

    def __init__(self, *, apc: bool = False) -> None:
        self.apc = apc
        self._mail: dict[Action, Tensor] = {}
        self._contributions: dict[Hashable, dict[int, Tensor]] = {}
        self._collected: dict[Hashable, int] = {}
        """Per all-reduce, how many ranks have taken the sum (the last one drops the entry)."""

    def endpoint(self, rank: int) -> "LocalEndpoint":
        return LocalEndpoint(self, rank)


class LocalEndpoint:
    """One rank's view of a :class:`LocalTransport`."""

    def __init__(self, hub: LocalTransport, rank: int) -> None:
        self.hub = hub
        self.rank = rank
        self.bytes_sent = 0
        """What :class:`DistTransport` would have sent by now (same accounting)."""
        self._sent_header: set[_Kind] = set()

    rendezvous = False
    """Mailboxes: a send never waits for its receive."""

    def send(self, message: Action, tensor: Tensor, dst: int) -> None:
        kind = _kind(message, self.rank, dst)
        if kind not in self._sent_header:
            self._sent_header.add(kind)
            self.bytes_sent += _HEADER_BYTES
        if not _compressed(tensor.dtype, self.hub.apc, message):
            self.bytes_sent += _nbytes([tensor])
            self.hub._mail[message] = tensor.clone()
            return
        first, rest = _pack(tensor)
        self.bytes_sent += _nbytes([first] if rest is None else [first, rest])
        wire = torch.empty(sum(_wire_sizes(tensor.shape, tensor.dtype)), dtype=torch.uint8,
                           device=tensor.device)
        wire[:first.numel()].copy_(first)

        def receive_rest(view: Tensor) -> None:
            assert rest is not None
            view.copy_(rest)

        self.hub._mail[message] = _unpack(wire, tensor.shape, tensor.dtype, receive_rest)

    def recv(self, message: Action, src: int) -> Waiting:
        while message not in self.hub._mail:
            yield
        return self.hub._mail.pop(message)

    def prefetch(self, message: Action, src: int) -> None:
        return None

    def all_reduce(self, key: Hashable, flat: Tensor, ranks: Sequence[int]) -> Waiting:
        contributions = self.hub._contributions.setdefault(key, {})
        contributions[self.rank] = flat.clone()
        while len(contributions) < len(ranks):
            yield
        total = contributions[ranks[0]].clone()
        for rank in ranks[1:]:
            total += contributions[rank]
        collected = self.hub._collected.get(key, 0) + 1
        if collected == len(ranks):  # everyone has its sum: keep no copies for the whole run
            del self.hub._contributions[key], self.hub._collected[key]
        else:
            self.hub._collected[key] = collected
        return total

    def finish(self) -> None:
        return None
