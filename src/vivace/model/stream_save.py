"""A checkpoint written from a stream of tensors, one file of bounded size at a time.

What: `save_streamed(model, tokenizer, tensors, path)` writes the directory `save_checkpoint` writes (the
same safetensors names, config, generation config and tokenizer files) from `tensors`, an iterable of
(name, unsharded tensor) in the model's state-dict names, holding at most one file's weights at once.

Why: the trainer's ranks gather their FSDP2 shards one tensor at a time (`Trainer.full_tensors`). Writing
through `save_pretrained` needs the whole state dict on rank 0 first: 120 GB of host memory for a 30B model
in fp32, at every checkpoint. Here rank 0 holds one file (SHARD_BYTES) and the tensor being gathered.

How: tensors collect into a file until the next would pass `shard_bytes`; each file's tensors are turned
back into the format the checkpoint's loader expects (transformers' `revert_weight_conversion`, per file,
as `save_pretrained` itself does for offloaded models: the fused MoE experts split into one tensor per
expert and projection) and written. Tied copies (the output head tied to the embedding) are left out, as
`save_pretrained` leaves them. One file is `model.safetensors`; more are `model-0000i-of-0000n.safetensors`
with the index transformers reads. A model whose conversions cannot be reverted file by file (one that
would need tensors from two files at once) is not streamed: `streamable` says so up front, from the
tensors' shapes alone, and the caller gathers the whole state instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from vivace.model.checkpoint import save_companions

SHARD_BYTES = 2 * 2**30  # weights per file: what rank 0 holds at once while saving (and their reverted copy)


def _revert(model: PreTrainedModel, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4 saves every tensor under the name it has
        return tensors
    return revert_weight_conversion(model, tensors)


def _files(model: PreTrainedModel, shapes: Iterable[tuple[str, torch.Size, torch.dtype]], shard_bytes: int):
    """The names of each file's tensors, in stream order, tied copies left out."""
    tied = set(getattr(model, "all_tied_weights_keys", None) or {}) if model.config.tie_word_embeddings else set()
    files, current, size = [], [], 0
    for name, shape, dtype in shapes:
        if name in tied:
            continue
        nbytes = shape.numel() * dtype.itemsize
        if current and size + nbytes > shard_bytes:
            files.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    return files + ([current] if current else [])


def streamable(model: PreTrainedModel, shard_bytes: int = SHARD_BYTES) -> bool:
    """Whether each file of `model`'s weights (as `save_streamed` would cut them) reverts to the loader's
    format on its own: tried on meta tensors of the same shapes, which cost no memory."""
    state = model.state_dict()
    shapes = [(name, state[name].shape, state[name].dtype) for name in sorted(state)]
    try:
        for names in _files(model, shapes, shard_bytes):
            _revert(model, {n: torch.empty(state[n].shape, dtype=state[n].dtype, device="meta") for n in names})
    except Exception:
        return False
    return True


def save_streamed(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    tensors: Iterable[tuple[str, torch.Tensor]],
    path: str | Path,
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Writes checkpoint directory `path` for `model` (a model on the meta device will do: its config,
    generation config and conversions are what is read) with the weights `tensors` yields, in sorted name
    order, each written to disk once its file is full. `streamable(model)` must hold."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    files = _files(model, ((n, state[n].shape, state[n].dtype) for n in sorted(state)), shard_bytes)
    owner = {name: i for i, names in enumerate(files) for name in names}
    names = ["model.safetensors"] if len(files) == 1 else [
        f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]  # fmt: skip
    weight_map, total, pending, written = {}, 0, {}, 0
    for name, tensor in tensors:
        if name not in owner:
            continue  # a tied copy
        if owner[name] != written:
            raise ValueError(f"saving {path}: {name} came out of sorted name order")
        pending[name] = tensor.detach().to("cpu").contiguous()
        if len(pending) == len(files[written]):  # the file is complete: revert it, write it, let it go
            reverted = {k: v.contiguous() for k, v in _revert(model, pending).items()}
            save_file(reverted, path / names[written], metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(reverted, names[written]))
            total += sum(v.numel() * v.element_size() for v in reverted.values())
            pending, written = {}, written + 1
    if written != len(files):
        raise ValueError(f"saving {path}: the weights stopped after {written} of {len(files)} files")
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    model.config.save_pretrained(path)
    save_companions(model, tokenizer, path)
    return path
