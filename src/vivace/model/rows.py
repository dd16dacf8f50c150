"""Rows of a checkpoint's tensors, read from its safetensors files without reading the rest.

What: `CheckpointRows.open(spec, model)` plans, for every tensor `model` holds (by the names and
shapes transformers gives them), where its rows are in the checkpoint directory's files; then
`rows(name, start, stop)` reads rows start..stop of its first dimension and nothing else.

Why: each trainer rank holds an FSDP2 shard, a block of dim-0 rows of every tensor. Reading just those
rows, every rank reads 1/W of the checkpoint, where otherwise rank 0 reads it whole (120 GB for a 30B
model in fp32) and broadcasts the shards (rl/trainer.py's load_sharded takes that path when this one
cannot).

How: a tensor the file holds under the model's name and shape is read as it is. transformers holds an
MoE layer's experts fused (`mlp.experts.gate_up_proj`: E × 2I × H, each expert's gate rows then its up
rows; `mlp.experts.down_proj`: E × H × I) where checkpoints store one tensor per expert and projection;
their rows are experts, read one expert at a time. Those are the only conversions reproduced here: a model
whose loader converts anything else that the files hold (renames, other fusions) is not planned
(`open` returns None), since rows read under another convention would be wrong weights, not an error.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PreTrainedModel

from vivace.model.checkpoint import initialised, model_dir, weight_files

# The expert fusions transformers' loader makes (conversion_mapping.py's "qwen2_moe" family: Qwen2/3-MoE,
# DeepSeek-V2/V3, OLMoE, GLM-4-MoE...): (source patterns, target) -> what the rows of the target are.
GATE_UP = (("mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"), "mlp.experts.gate_up_proj")
DOWN = (("mlp.experts.*.down_proj.weight",), "mlp.experts.down_proj")
FUSIONS = {GATE_UP: [("MergeModulelist", 0), ("Concatenate", 1)], DOWN: [("MergeModulelist", 0)]}  # the loader's steps


class CheckpointRows:
    def __init__(self, files: dict[str, Path], plans: dict[str, tuple[str, list[list[str]]]]):
        self.files = files  # tensor key -> the file holding it
        self.plans = plans  # model name -> ("same", [[key]]) or ("experts", [[keys of expert 0], ...])
        self.handles: dict[Path, object] = {}

    @classmethod
    def open(cls, spec: str, model: PreTrainedModel) -> CheckpointRows | None:
        """The plan for every tensor in `model`'s state dict (a model on the meta device will do) from
        checkpoint `spec`; None when its rows cannot be read this way: no checkpoint (`tiny-init`), .bin
        weights, a conversion of the loader's other than the expert fusions, or names and shapes that do not
        match (load_model then refuses or converts the checkpoint, and says why)."""
        if initialised(spec):
            return None
        try:
            found = weight_files(model_dir(spec))
        except (OSError, ValueError):
            return None  # load_model, on rank 0, says what is wrong with the files
        if found is None or not _conversions_understood(model, found[1].keys()):
            return None
        files = {name: file for name, (file, _) in found[1].items()}
        shapes = {name: shape for name, (_, shape) in found[1].items()}
        plans = {}
        for name, tensor in model.state_dict().items():
            plan = _plan(name, tuple(tensor.shape), shapes)
            if plan is None:
                if _tied(model, name):
                    continue  # the loader ties it to its source (lm_head to the embedding)
                return None
            plans[name] = plan
        return cls(files, plans)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start..stop of the first dimension of the model's tensor `name`, as the files store them."""
        kind, keys = self.plans[name]
        if kind == "same":
            return self._slice(keys[0][0], start, stop)
        return torch.stack([torch.cat([self._slice(k, 0, None) for k in keys[e]]) for e in range(start, stop)])

    def _slice(self, key: str, start: int, stop: int | None) -> torch.Tensor:
        file = self.files[key]
        if file not in self.handles:
            self.handles[file] = safe_open(str(file), framework="pt")
        part = self.handles[file].get_slice(key)
        return part[start:stop] if part.get_shape() else part[:]  # a 0-d tensor has no rows to slice


def _pattern(glob: str) -> re.Pattern:
    return re.compile(r"(^|\.)" + re.escape(glob).replace(r"\*", r"\d+") + "$")


def _conversions_understood(model: PreTrainedModel, keys) -> bool:
    """Whether every conversion transformers' loader would make on these keys is one this module reads:
    the expert fusions, or a conversion none of the keys is subject to."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:  # transformers 4 loads every tensor as the files hold it
        return True
    for transform in get_model_conversion_mapping(model):
        sources = tuple(getattr(transform, "source_patterns", ()) or ())
        targets = tuple(getattr(transform, "target_patterns", ()) or ())
        ops = [(type(op).__name__, getattr(op, "dim", None)) for op in getattr(transform, "operations", None) or ()]
        if len(targets) == 1 and FUSIONS.get((sources, targets[0])) == ops:
            continue
        # A pattern may be a regex (renames) or a glob (converters): either, if it finds a key, acts on it.
        found = [re.compile(p) if type(transform).__name__ == "WeightRenaming" else _pattern(p) for p in sources]
        if any(p.search(k) for p in found for k in keys):
            return False
    return True


def _plan(name: str, shape: tuple[int, ...], shapes: dict[str, tuple[int, ...]]) -> tuple | None:
    if shapes.get(name) == shape:
        return ("same", [[name]])
    for sources, target in (GATE_UP, DOWN):
        if not name.endswith("." + target) or not shape:
            continue
        prefix = name[: -len(target)]
        keys = [[prefix + s.replace("*", str(e)) for s in sources] for e in range(shape[0])]
        rows = [sum(shapes.get(k, (0,))[0] for k in expert) for expert in keys]
        fits = all(k in shapes and shapes[k][1:] == shape[2:] for expert in keys for k in expert)
        if fits and set(rows) == {shape[1]}:
            return ("experts", keys)
    return None


def _tied(model: PreTrainedModel, name: str) -> bool:
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    return getattr(model.config, "tie_word_embeddings", False) and name in tied
