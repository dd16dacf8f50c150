"""Weight sync, trainer to sampler replicas: by collective broadcast, or through Ray's object store.

Broadcast: trainer rank 0 sends every tensor to every sampler
replica over a process group of their own — NCCL between GPUs (GPU memory to GPU memory, no host
copy), gloo on CPU (the same code path, testable anywhere).

The group is separate from the trainer's FSDP group (its own TCPStore and ProcessGroup objects,
not the default group), so samplers never join the trainer's collectives. Tensors go in sorted
name order, each gathered from the trainer ranks' shards just before it is sent (the trainer never
holds the whole model at once: Trainer.full_tensors), each cast by the sender to the receivers'
dtype (a bf16 sampler of an fp32 trainer: a collective moves bytes, and a size that differs aborts
gloo's process or garbles NCCL's); each receiver writes straight into its model's parameters (the
engine holds its lock meanwhile, so no step sees half-updated weights).

Object store (`store_pieces`, `from_store`): trainer rank 0 puts the weights in pieces of at most
STORE_PIECE_BYTES as the ranks gather them, so it never holds the whole model; each replica fetches every
piece and loads them as one update. A tensor goes as its raw bytes in a NumPy array: Ray writes those
into the store with one copy and reads them back with none, where a pickled tensor costs several copies.
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist

# Large enough that a piece's put costs little beside its copy, small enough that rank 0 never holds
# much of the model at once (docs/benchmarks.md, "The object-store weight sync").
STORE_PIECE_BYTES = 256 << 20

Packed = tuple[str, tuple[int, ...], np.ndarray]  # a tensor in the store: dtype name, shape, raw bytes


def store_pieces(
    tensors: Iterable[tuple[str, torch.Tensor]], piece_bytes: int
) -> Iterator[tuple[dict[str, Packed], int]]:
    """(name, tensor) pairs grouped, in order, into pieces of at most `piece_bytes` (a larger tensor alone),
    each tensor's bytes copied to the CPU as a NumPy array; yields (piece, its bytes): one object each."""
    piece: dict[str, Packed] = {}
    size = 0
    for name, value in tensors:
        nbytes = value.numel() * value.element_size()
        if piece and size + nbytes > piece_bytes:
            yield piece, size
            piece, size = {}, 0
        raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        piece[name] = (str(value.dtype).removeprefix("torch."), tuple(value.shape), raw)
        size += nbytes
    if piece:
        yield piece, size


def from_store(pieces: Iterable[Mapping[str, Packed]]) -> dict[str, torch.Tensor]:
    """The tensors of `store_pieces`' pieces, by name, over the pieces' own memory (read-only in the object
    store: copy from them, never write to them)."""
    state = {}
    with warnings.catch_warnings():  # torch warns that the store's arrays are read-only; they are only read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for piece in pieces:
            for name, (dtype, shape, raw) in piece.items():
                state[name] = torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
    return state


class WeightBroadcast:
    """One member of the sync group: rank 0 is the trainer's rank 0, ranks 1.. are samplers."""

    def __init__(self, address: str, rank: int, world_size: int, device: str = "cpu", timeout_s: float = 600.0):
        host, port = address.rsplit(":", 1)
        self.rank, self.device = rank, device
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
        if device.startswith("cuda"):
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size)
        else:
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)

    def send(
        self,
        tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        dtypes: Mapping[str, torch.dtype] | None = None,
    ) -> int:
        """Rank 0: broadcasts every tensor, as the receivers hold it (`dtypes`, by name: what their
        join_weight_sync returned; None: as it is); returns the bytes sent (per receiver). `tensors`: a
        mapping, or (name, tensor) pairs in sorted name order (a stream: Trainer.full_tensors gathers each
        as it goes, so the whole model is never in one place). ValueError for pairs out of order: the
        receivers take the names sorted and would write each tensor into another's place."""
        pairs = sorted(tensors.items()) if isinstance(tensors, Mapping) else tensors
        total, last = 0, None
        for name, value in pairs:
            if last is not None and name <= last:
                raise ValueError(f"weight sync: {name!r} came after {last!r}; send the tensors in sorted name order")
            last = name
            tensor = value.to(device=self.device, dtype=(dtypes or {}).get(name)).contiguous()
            self.group.broadcast(tensor, 0).wait()
            total += tensor.numel() * tensor.element_size()
        return total

    def receive(self, names: Iterable[str], params: Mapping[str, torch.Tensor]) -> int:
        """Ranks 1..: receives the named tensors (the sender's sorted names) into `params` in place."""
        total = 0
        for name in sorted(names):
            target = params[name]
            buffer = target if target.is_contiguous() else torch.empty_like(target)
            self.group.broadcast(buffer, 0).wait()
            if buffer is not target:
                target.copy_(buffer)
            total += buffer.numel() * buffer.element_size()
        return total
