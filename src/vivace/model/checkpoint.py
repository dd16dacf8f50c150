"""Policy models: Hugging Face causal LMs in standard checkpoint directories.

What: `tiny_config` (the laptop preset: a ~8M-parameter Qwen3-MoE, 8 experts top-2, 8,192
positions), `load_model(spec)` for `tiny` or a local checkpoint directory, the files a checkpoint
directory holds read in one place (`model_config`, `generation_eos_ids`), and `save_checkpoint`,
which writes a directory that plain `transformers.AutoModelForCausalLM` / `AutoTokenizer` load
unchanged (config.json, model.safetensors, tokenizer files with the chat template).

Why standard directories: the same files move between vivace's trainer, its engine, vLLM/SGLang
and the Hugging Face ecosystem with no conversion step.

`tiny` resolves to the trained checkpoint shipped in `model/assets/tiny` when it exists, else to
a freshly initialised model (seeded, so every process gets the same weights) with the reference
tokenizer; `tiny-init` is always that fresh model (the warm start's starting point, and tests
that need an untrained policy). Not covered: downloading from a hub (nothing is fetched at run
time) and sharded loading across devices (rl/trainer.py's load_sharded does that).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3MoeConfig,
)

from vivace.model import spec as model_spec
from vivace.model.spec import ASSETS, TINY_DIR, TINY_INIT, TINY_NAMES, initialised, model_dir  # noqa: F401 (re-exported)

TINY_SEED = 0


def tiny_config(vocab_size: int, **overrides) -> Qwen3MoeConfig:
    """The `tiny` preset: trains and samples on 2 CPU cores (~8M parameters, ~3M active per token)."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,  # dense MLP width (unused: every layer is sparse)
        moe_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # attention over the ~2,700-token system turn dominates training on CPU: half the cost of 64
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        router_aux_loss_coef=0.001,
    )
    fields.update(overrides)
    return Qwen3MoeConfig(**fields)


def parse_arch(text: str) -> dict:
    """`key=value,...` -> tiny_config overrides, each key a field of the tiny preset's config and each
    value of that field's type (a larger policy: `hidden_size=384,num_hidden_layers=6`)."""
    base = tiny_config(1)
    overrides = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{item!r} is not key=value")
        current = getattr(base, key, None)  # attribute names too (num_experts is num_local_experts)
        if key == "vocab_size" or not isinstance(current, (int, float, bool)):
            raise ValueError(f"{key!r} is not a numeric field of the tiny config (e.g. hidden_size, num_hidden_layers)")
        kind = type(current)
        try:
            overrides[key] = value.strip().lower() in ("1", "true") if kind is bool else kind(value)
        except ValueError:
            raise ValueError(f"{key}={value!r}: expected {kind.__name__}") from None
    problems = arch_problems(tiny_config(1, **overrides))
    if problems:
        raise ValueError(problems[0])
    return overrides


# Sizes a model needs at least one of: 0 or less builds no model, or one that fails only when it first
# samples (a context of -5 tokens, a division by a decoder_sparse_step of 0).
POSITIVE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                   "decoder_sparse_step")  # fmt: skip


def arch_problems(config: PretrainedConfig) -> list[str]:
    """What makes `config` no model to build and sample, each naming its field: a size that is not a
    positive integer, attention heads that are not a multiple of the key/value heads, an MoE layer whose
    experts per token are not 1..num_experts (0 routes every token nowhere; more than there are fails in
    the first top-k). The checks `--arch` gets (parse_arch) and a checkpoint's config.json gets
    (model_config); fields a config does not have, or leaves None, are not checked."""
    problems = []
    for name in POSITIVE_FIELDS:
        value = getattr(config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"{name} must be a positive integer, got {value!r}")
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if not problems and heads and kv and heads % kv:
        problems.append(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
    top_k = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_experts", None)  # Qwen MoE's name; Mixtral's num_local_experts
    experts = getattr(config, "num_local_experts", None) if experts is None else experts
    if top_k is not None and experts is not None:
        if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
            problems.append(f"num_experts must be a positive integer, got {experts!r}")
        elif isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
            problems.append(f"num_experts_per_tok must be 1..num_experts ({experts}), got {top_k!r}")
    return problems


def deepen(model: PreTrainedModel, num_layers: int, seed: int = 0) -> PreTrainedModel:
    """The same model with more decoder layers, each new one starting as the identity (block
    expansion, as in LLaMA Pro): its attention output projection and its experts' down projections
    are zero, so it adds nothing to the residual stream and the deeper model computes exactly what
    `model` did. Training then grows them, keeping what the old layers know (a model trained from
    scratch at the larger size would first have to relearn copying). The new layers are spread
    evenly: 4 -> 6 puts one after old layers 1 and 3."""
    old = model.config.num_hidden_layers
    if num_layers <= old:
        raise ValueError(f"num_hidden_layers={num_layers}: a checkpoint can only be deepened (it has {old} layers)")
    extra = num_layers - old
    after = [max((j + 1) * old // extra - 1, 0) for j in range(extra)]  # the old layer each new one follows
    source: list[int | None] = []  # per new position: the old layer it copies, or None (a new identity layer)
    like: list[int] = []  # per new position: the old layer it copies or follows, whose config entries it takes
    for i in range(old):
        source += [i] + [None] * after.count(i)
        like += [i] * (1 + after.count(i))
    cfg = _deepened_config(model.config, like)
    torch.manual_seed(seed)
    deeper = AutoModelForCausalLM.from_config(cfg, dtype=next(model.parameters()).dtype)
    state = model.state_dict()
    target = deeper.state_dict()
    prefix = "model.layers."
    for key in target:
        if not key.startswith(prefix):
            target[key] = state[key]
            continue
        index, rest = key[len(prefix) :].split(".", 1)
        src = source[int(index)]
        if src is not None:
            target[key] = state[f"{prefix}{src}.{rest}"]
        elif IDENTITY_OUTPUTS.intersection(rest.split(".")):
            target[key] = torch.zeros_like(target[key])
    deeper.load_state_dict(target)
    return deeper


# The projections that write a layer's attention and MLP (experts, shared expert) into the residual
# stream: zero in a new layer (weights and biases), so it adds nothing.
IDENTITY_OUTPUTS = {"o_proj", "down_proj"}


def _deepened_config(config: PretrainedConfig, like: list[int]) -> PretrainedConfig:
    """`config` with `len(like)` layers, new layer i configured as old layer `like[i]`: its entry in
    every per-layer list (layer_types: full or sliding attention), its MLP kind (an MoE config's
    mlp_only_layers and decoder_sparse_step, rewritten as the explicit list), and Qwen's
    max_window_layers kept consistent with layer_types. Without this the model is built for the
    old depth (transformers indexes layer_types past its end) or with layers of another kind."""
    old = config.num_hidden_layers
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = len(like)
    for name, value in vars(config).items():
        if name == "mlp_only_layers" or not (isinstance(value, list) and len(value) == old and "layer" in name):
            continue
        if not name.endswith("layer_types"):
            raise ValueError(f"cannot deepen a {type(config).__name__}: its config field {name} has one entry per "
                             "layer and no known way to extend it; train this checkpoint at its own depth (no --arch)")  # fmt: skip
        setattr(cfg, name, [value[s] for s in like])
    dense = _dense_mlp_layers(config)
    if dense is not None:  # as a list: a sparse step of 2 would otherwise shift which new layers are MoE
        cfg.mlp_only_layers = [i for i, s in enumerate(like) if s in dense]
        cfg.decoder_sparse_step = 1
    window = getattr(config, "max_window_layers", None)
    if isinstance(window, int):  # Qwen: the layers from this index on slide; kept true to layer_types
        cfg.max_window_layers = sum(s < window for s in like) if window < old else max(window, len(like))
    return cfg


def _dense_mlp_layers(config: PretrainedConfig) -> set[int] | None:
    """The layers of a Qwen MoE config (mlp_only_layers, decoder_sparse_step) whose MLP is dense, as
    transformers decides it; None for a config without that layout."""
    only = getattr(config, "mlp_only_layers", None)
    if only is None:
        return None
    step = getattr(config, "decoder_sparse_step", None) or 1
    sparse = (getattr(config, "num_experts", None) or 0) > 0
    return {i for i in range(config.num_hidden_layers) if i in only or not (sparse and (i + 1) % step == 0)}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # "tiny" or the checkpoint path


def load_model(spec: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedModel:
    """`tiny` or a local checkpoint directory -> model (eval mode) and tokenizer."""
    if initialised(spec):
        from vivace.model.tokenizer import reference_tokenizer

        tokenizer = reference_tokenizer()
        torch.manual_seed(TINY_SEED)
        model = AutoModelForCausalLM.from_config(tiny_config(len(tokenizer)), dtype=dtype)
        return LoadedModel(model.to(device).eval(), tokenizer, spec)
    path = model_dir(spec)
    config = model_config(spec)  # config.json refused by name before the tokenizer and the weights read it
    tokenizer = _tokenizer_of(path, spec)
    if problem := vocab_problem(tokenizer, config):
        raise ValueError(f"{spec}: {problem}")
    if path.resolve() == model_spec.TINY_DIR.resolve():  # read at call time: tests point it elsewhere
        _require_shipped(path)
    _warn_stored_dtype(path, config)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype, output_loading_info=True)
    except (OSError, RuntimeError, ValueError, SafetensorError, pickle.UnpicklingError, EOFError) as e:
        raise ValueError(_weights_problem(spec, path, e)) from e
    # from_pretrained only warns when weights and config disagree in names or layer count, then
    # initialises what is missing at random: a silently different model. Refuse it instead.
    wrong = {k: info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
    if wrong:
        detail = "; ".join(f"{k.replace('_', ' ')}: {', '.join(map(str, sorted(v)[:3]))}" + (", …" if len(v) > 3 else "")
                           for k, v in wrong.items())  # fmt: skip
        raise ValueError(f"{spec}: config.json does not match the weights ({detail}); fix config.json or save it again")
    model = model.to(device).eval()
    _require_finite(model, spec)
    return LoadedModel(model, tokenizer, spec)


def vocab_problem(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> str | None:
    """Why the model cannot take every id its tokenizer makes (its embedding has fewer rows), or None. Such a
    pair loaded, and every episode then ended in an engine error that read as the policy failing. A padded
    embedding (more rows than the tokenizer has ids) is fine."""
    rows = getattr(config, "vocab_size", None)
    top = max(tokenizer.get_vocab().values(), default=-1)
    if isinstance(rows, int) and top >= rows:
        return (f"its tokenizer makes ids up to {top} but the model's vocab_size (config.json) is {rows}: every "
                "text that uses the ids beyond it fails; give the checkpoint the tokenizer it was trained with")  # fmt: skip
    return None


def _weights_problem(spec: str, path: Path, e: Exception) -> str:
    """Why from_pretrained could not read checkpoint directory `path`'s weights, in one line: a Git LFS
    pointer in place of a weight file named as require_weights names it; else the loader's first line
    (never the pickle loader's advice to load with weights_only=False: code from the file would run)."""
    for file in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        if _lfs_pointer(file):
            return f"{file}: a Git LFS pointer, not the weights: fetch them (git lfs pull)"
    if isinstance(e, (pickle.UnpicklingError, EOFError)):
        first = "its .bin file is not a PyTorch weights file"
    else:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return (f"{spec}: cannot load the checkpoint's weights ({first}); it is incomplete or damaged, or its "
            "config.json does not describe these weights: save it again (vivace sft ship, save_checkpoint)")  # fmt: skip


LFS_POINTER = b"version https://git-lfs"  # how a Git LFS pointer file begins


def _lfs_pointer(file: Path) -> bool:
    """Whether `file` is a Git LFS pointer (a clone without `git lfs pull`) rather than the file itself."""
    try:
        with file.open("rb") as f:
            return f.read(64).startswith(LFS_POINTER)
    except OSError:
        return False


def _require_finite(model: PreTrainedModel, spec: str) -> None:
    """ValueError naming the tensors that hold NaN or ±inf: weights that load and then sample garbage
    (a run that diverged and was saved, damaged bytes that decode as NaN) are refused, not served.

    Cost: one float32-accumulated sum per tensor on the device it was loaded to (a sum is NaN or inf
    whenever one element is: one read of the weights, no copy to the host, no memory beyond one number per
    tensor), one synchronisation for all of them, and an exact isfinite only for a tensor whose sum was
    not finite (it may have overflowed). Measured on the shipped tiny (7.7M parameters, 2 CPU cores): ~3 ms
    in fp32 or bf16, next to ~160 ms for the rest of load_model; torch.isfinite(t).all() per tensor took
    ~36 ms. On a GPU a sum reads memory at its bandwidth (not measured; at 1-3 TB/s a 16 GB model takes
    ~5-15 ms). fp8 and other dtypes are not checked."""
    named = [(n, t.detach()) for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
             if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]  # fmt: skip
    if not named:
        return
    with torch.no_grad():
        sums = torch.stack([t.sum(dtype=torch.promote_types(t.dtype, torch.float32)).float() for _, t in named])
        suspects = torch.isfinite(sums).logical_not().nonzero().flatten().tolist()
        bad = [named[i][0] for i in suspects if not torch.isfinite(named[i][1]).all()]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ValueError(f"{spec}: its weights hold NaN or infinite values ({', '.join(bad[:3])}{more}): the "
                         "checkpoint is damaged or was saved from a run that diverged; use another checkpoint")  # fmt: skip


def _require_shipped(path: Path) -> None:
    """ValueError when the shipped tiny checkpoint's weights are not the bytes its warm_start.json records
    (ship_checkpoint writes both): a damaged or partial checkout, which would otherwise load as another
    model. Hashing its 15.5 MB took ~15 ms (2 CPU cores), next to ~160 ms for the rest of load_model; a large
    checkpoint is never hashed (only the shipped one has the record)."""
    record, weights = path / "warm_start.json", path / "model.safetensors"
    if not record.is_file() or not weights.is_file():
        return  # no record to check against, or no weights: from_pretrained names the missing file
    restore = f"restore it (git checkout -- {path}, or git lfs pull where Git LFS stores it)"
    try:
        expected = json.loads(record.read_text(encoding="utf-8"))["sha256"]
        if not isinstance(expected, str):
            raise TypeError(type(expected).__name__)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{record}: cannot read its sha256 ({type(e).__name__}: {e}): the shipped checkpoint "
                         f"is damaged; {restore}") from None  # fmt: skip
    if _lfs_pointer(weights):
        raise ValueError(f"{weights}: a Git LFS pointer, not the weights: fetch them (git lfs pull)")
    with weights.open("rb") as f:
        actual = hashlib.file_digest(f, "sha256").hexdigest()
    if actual != expected:
        raise ValueError(f"{weights}: its sha256 is not the one {record.name} records, so these are not the "
                         f"shipped weights (a damaged or partial checkout); {restore}")  # fmt: skip


# safetensors' names of the dtypes a config.json names, and their widths in bytes
_STORED = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
_WIDTH = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def _warn_stored_dtype(path: Path, config: PretrainedConfig) -> None:
    """One warning line when the safetensors weights are stored in a dtype of the width config.json's
    dtype has, but not in that one (F16 where it says bfloat16): weights converted without their config,
    or a header whose dtypes were changed, so that the bytes decode as other numbers. Weights wider or
    narrower than it says (F32 saved from an fp32 run under a bf16 config) load as the numbers they
    are, and do not warn. Reads the headers only (a few kB to a few MB); silent when they cannot be read
    (from_pretrained says why) or config.json names no dtype."""
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)).removeprefix("torch.")
    wanted = _STORED.get(dtype)
    try:
        found = weight_files(path)
        files = sorted({file for file, _ in found[1].values()}) if found else []
        stored = {t.get("dtype") for file in files for t in _header(file).values()}
    except (OSError, ValueError, AttributeError):
        return
    same_width = {d for d in stored if d in _WIDTH and _WIDTH[d] == _WIDTH.get(wanted)}
    if wanted and same_width and wanted not in stored:
        warnings.warn(f"{path}: the weights are stored as {', '.join(sorted(same_width))} where config.json says "
                      f"{dtype}: converted without their config, or damaged", RuntimeWarning, stacklevel=3)  # fmt: skip


# Weight files of a Hugging Face checkpoint directory (one file, or an index of shards), in the order
# transformers picks them: the first one present is what loads.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def require_weights(spec: str, config: PretrainedConfig | None = None) -> None:
    """ValueError when the checkpoint directory `spec` has a config but no weight files, or weights that
    `load_model` would refuse: a safetensors file whose header cannot be read or whose data is cut short,
    or tensor names or shapes other than those of the model its config.json describes (an edited
    config.json, weights of another model). `tiny` and `tiny-init` without a shipped checkpoint are
    initialised, and need none. Found before a trainer loads it after minutes of start-up, not there.

    Cheap for any size: it reads the safetensors headers, not the weights, and builds the model on the
    meta device (no memory). Not covered: .bin weights (pickles: no header to read without loading
    them) and damaged bytes inside a file whose header and length are right. `config`: model_config(spec),
    when the caller has read it already."""
    if initialised(spec):
        return
    path = model_dir(spec)
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{spec} has a config but no weights ({', '.join(WEIGHT_FILES[:3])}); give `tiny` "
                         "or a complete checkpoint directory (as save_checkpoint writes it)")  # fmt: skip
    found = weight_files(path)
    if found is None:
        return
    file, tensors = found
    shapes = {name: shape for name, (_, shape) in tensors.items()}
    problems = _mismatches(shapes, config or model_config(spec), path / "config.json")
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ValueError(f"{file} does not hold the model its config.json describes: {'; '.join(problems[:3])}"
                         f"{more}. Fix config.json to match the weights, or save the checkpoint again")  # fmt: skip


def weight_files(path: Path) -> tuple[Path, dict[str, tuple[Path, tuple[int, ...]]]] | None:
    """The safetensors weights transformers loads from checkpoint directory `path` (the file, or the
    shards' index) and, for every tensor in them, the file holding it and its shape, read from the
    headers; None for .bin weights."""
    if (single := path / "model.safetensors").is_file():
        return single, {name: (single, shape) for name, shape in _header_shapes(single).items()}
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: cannot read its weight_map ({type(e).__name__}: {e}); copy or save the "
                         "checkpoint again") from None  # fmt: skip
    tensors: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for shard in shards:
        if not (path / shard).is_file():
            raise ValueError(f"{index} lists the shard {shard}, which is not in {path}; copy it there or save the "
                             "checkpoint again")  # fmt: skip
        tensors.update({name: (path / shard, shape) for name, shape in _header_shapes(path / shard).items()})
    return index, tensors


def _header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header (`_header`)."""
    return {name: t["shape"] for name, t in _header(file).items()}


def _header(file: Path) -> dict[str, dict]:
    """Tensor name -> its entry (dtype, shape as a tuple, data_offsets) from a safetensors file's header
    (its length in 8 bytes, then JSON), read without reading or mapping the tensors (safetensors' own `safe_open` maps the whole file, which a
    machine may refuse for one of 60 GB); ValueError naming the file and what to do when it is not a
    safetensors file or not as long as its header says (a copy or download that stopped: safetensors
    refuses both)."""
    again = "copy it again or save the checkpoint again"
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(64)
        if head.startswith(LFS_POINTER):
            raise ValueError(f"{file}: a Git LFS pointer, not the weights: fetch them (git lfs pull)")
        n = int.from_bytes(head[:8], "little")
        if len(head) < 8 or n > 100_000_000:  # safetensors' own limit on a header
            raise ValueError(f"{file}: not a safetensors file; {again}")
        if size < 8 + n:
            raise ValueError(f"{file}: cut short: {size:,} bytes, inside its header of {8 + n:,}; {again}")
        f.seek(8)
        text = f.read(n)
    try:
        header = json.loads(text)
        tensors = {name: {**t, "shape": tuple(int(d) for d in t["shape"])}
                   for name, t in header.items() if name != "__metadata__"}  # fmt: skip
        end = 8 + n + max((t["data_offsets"][1] for t in tensors.values()), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise ValueError(f"{file}: not a safetensors file (its header is not one); {again}") from None
    if size != end:
        what = "cut short" if size < end else "too long"
        raise ValueError(f"{file}: {what}: {size:,} bytes where its header describes {end:,}; {again}")
    return tensors


def _mismatches(found: dict[str, tuple[int, ...]], config: PretrainedConfig, config_file: Path) -> list[str]:
    """How tensor shapes `found` in a checkpoint differ from the model `config` describes, each in words,
    as `load_model` judges them (every tensor there, none extra, each of the model's shape); [] when
    they fit."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4 holds every tensor as checkpoints store it
        revert_weight_conversion = None
    try:
        with torch.device("meta"):  # names and shapes without memory for the weights
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return [f"{config_file} makes no model transformers can build ({first})"]
    native = model.state_dict()
    # transformers holds some tensors fused (an MoE layer's experts in one) and writes them unfused,
    # as published checkpoints have them; its loader takes either form: compare with the file's.
    forms = [native] + ([revert_weight_conversion(model, dict(native))] if revert_weight_conversion else [])
    expected = {k: tuple(v.shape) for k, v in max(forms, key=lambda f: len(f.keys() & found.keys())).items()}
    prefix = model.base_model_prefix  # a base model's checkpoint lacks it; the loader adds it
    found = {k if k in expected or f"{prefix}.{k}" not in expected else f"{prefix}.{k}": v for k, v in found.items()}
    # Tied (lm_head): the loader ties it to its source. transformers 4 has no all_tied_weights_keys.
    tied = model._tied_weights_keys if getattr(config, "tie_word_embeddings", False) else None
    optional = set(getattr(model, "all_tied_weights_keys", tied) or ())
    # The loader's own exceptions: names a model declares ignorable, and buffers older checkpoints saved.
    skip_missing = re.compile("|".join(model._keys_to_ignore_on_load_missing or ()) or "(?!)")
    skip_extra = re.compile("|".join([*(model._keys_to_ignore_on_load_unexpected or ()), r"rotary_emb\.inv_freq",
                                      r"(^|\.)position_ids$"]))  # fmt: skip

    def shape(s: tuple[int, ...]) -> str:
        return f"({', '.join(map(str, s))})"

    wrong = [f"{k}: the weights have shape {shape(s)}, config.json makes {shape(expected[k])}"
             for k, s in sorted(found.items()) if k in expected and s != expected[k]]  # fmt: skip
    missing = [f"{k}: config.json's model has it, the weights do not" for k in sorted(expected)
               if k not in found and k not in optional and not skip_missing.search(k)]  # fmt: skip
    extra = [f"{k}: in the weights, not in config.json's model" for k in sorted(found)
             if k not in expected and not skip_extra.search(k)]  # fmt: skip
    return wrong + missing + extra


def model_config(spec: str) -> PretrainedConfig:
    """The config of `tiny`, `tiny-init` or a checkpoint directory, without loading the weights;
    ValueError naming config.json if `spec` names no model, or its config.json cannot be read or
    describes no model to build and sample (arch_problems: a size below 1, 0 experts per token...)."""
    if initialised(spec):
        return tiny_config(len(load_tokenizer(spec)))
    path = model_dir(spec)
    config = _read_config(path)
    problems = arch_problems(config)
    if problems:
        raise ValueError(f"{path / 'config.json'}: {'; '.join(problems)}; fix it or save the checkpoint again")
    return config


def _read_config(path: Path) -> PretrainedConfig:
    """Checkpoint directory `path`'s config.json as transformers reads it; ValueError naming the file."""
    file = path / "config.json"
    try:
        return AutoConfig.from_pretrained(path)
    except CONFIG_ERRORS as e:
        raise ValueError(
            f"{file}: cannot read it ({_config_error(file, e)}); fix it or save the checkpoint again"
        ) from None


try:  # transformers 5's configs check their fields' types, raising huggingface_hub's own error
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # older: no such checks
    StrictDataclassError = ValueError  # type: ignore[misc,assignment]
# What reading a malformed config.json raises: a list where an object belongs is a TypeError (**config),
# a field of the wrong type a StrictDataclassError, a missing or unknown model_type a ValueError.
CONFIG_ERRORS = (OSError, ValueError, TypeError, KeyError, AttributeError, StrictDataclassError)


def _config_error(file: Path, e: Exception) -> str:
    """Why `file` (a config.json) could not be read, in one line: what it holds when it is JSON but not
    an object, else the loader's message with its lines joined (a field's error names it on the first
    and says what it expected on the next)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    text = " ".join(str(e).split())
    return (text[:300] + "…" if len(text) > 300 else text) or type(e).__name__


def declared_context(path: str | Path) -> int | None:
    """The context, in tokens, that a checkpoint directory's config.json declares: its
    `max_position_embeddings` (a multimodal config's `text_config`'s). None when the directory has no
    such file or field, or the file cannot be read: loading the model is what reports a bad config."""
    file = Path(path).expanduser() / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8")) if str(path) and file.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    config = config if isinstance(config, dict) else {}
    text = config.get("text_config")
    n = config.get("max_position_embeddings", text.get("max_position_embeddings") if isinstance(text, dict) else None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def generation_eos_ids(path: str | Path) -> list[int]:
    """The ids that end generation by a checkpoint directory's generation_config.json: its
    `eos_token_id`, one id or a list (Llama 3 Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>;
    Qwen2.5 Instruct: <|im_end|>, <|endoftext|>). [] when the directory has no such file or the
    file no such field; ValueError naming the file when it is not a JSON object or the field is
    not token ids. Whether the ids are in the tokenizer's vocabulary is the caller's to check."""
    file = Path(path).expanduser() / "generation_config.json"
    if not str(path) or not file.is_file():
        return []
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{file}: cannot read it as JSON ({e}); fix or remove it") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(config).__name__}; fix or remove it")
    eos = config.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{file}: eos_token_id must be a token id or a list of token ids, got {json.dumps(eos)}")
    return list(dict.fromkeys(ids))


def _tokenizer_of(path: Path, spec: str) -> PreTrainedTokenizerBase:
    """A checkpoint directory's tokenizer; a directory without one is refused (transformers would
    otherwise hand back an empty tokenizer, and every prompt would be empty)."""
    if missing := model_spec.missing_checkpoint(spec):  # a path that is not there: not a tokenizer's problem
        raise ValueError(missing)
    if not path.exists():
        raise ValueError(f"{spec!r} is not `tiny`, `tiny-init` or a checkpoint directory (there is no {path}); give "
                         "one of those")  # fmt: skip
    if not (path / "tokenizer_config.json").is_file():
        raise ValueError(f"{spec!r} has no tokenizer: expected `tiny` or a checkpoint directory with tokenizer files")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except CONFIG_ERRORS as e:
        if (path / "config.json").is_file():
            _read_config(path)  # the tokenizer's loader reads it too: a damaged one is named as model_config names it
        if damaged := _damaged_tokenizer_file(path):
            raise ValueError(
                f"{damaged}: the tokenizer cannot load; restore the file or save the checkpoint again"
            ) from e
        first = " ".join(str(e).split())[:300] or type(e).__name__
        raise ValueError(f"{spec}: cannot load its tokenizer ({first}); save the checkpoint again") from e
    if len(tokenizer) < 2:
        raise ValueError(f"{spec}: its tokenizer files hold no vocabulary (tokenizer.json missing?)")
    return tokenizer


def _damaged_tokenizer_file(path: Path) -> str | None:
    """The first of a checkpoint directory's tokenizer JSON files that is not a JSON object (cut short,
    binary, a Git LFS pointer), named with what is wrong; None when they all read. Run only once the
    tokenizer failed to load, so a good checkpoint never pays for reading them twice."""
    for name in ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json"):
        file = path / name
        if not file.is_file():
            continue
        if _lfs_pointer(file):
            return f"{file}: a Git LFS pointer, not the file (git lfs pull)"
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
            return f"{file}: not JSON ({e})"
        if not isinstance(data, dict):
            return f"{file}: a JSON {type(data).__name__}, not an object"
    return None


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer of `tiny` or of a checkpoint directory, without loading the weights."""
    if spec == TINY_INIT or (spec == "tiny" and not (TINY_DIR / "tokenizer_config.json").is_file()):
        from vivace.model.tokenizer import reference_tokenizer

        return reference_tokenizer()
    return _tokenizer_of(TINY_DIR if spec == "tiny" else Path(spec).expanduser(), spec)


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Writes a standard Hugging Face directory (safetensors weights, config, tokenizer, chat template)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    save_companions(model, tokenizer, path)
    return path


# What a checkpoint directory holds beside its weights and config.json that says how to use them. A checkpoint
# trained from it gets these files as they are: save_pretrained rewrote them (another tokenizer_class, a
# normalizer that class adds, one end-of-generation id where generation_config.json listed several).
COMPANION_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json",
)  # fmt: skip
_LICENSE_FILE = re.compile(r"^(LICEN[CS]E|NOTICE|USE_POLICY)", re.IGNORECASE)


def save_companions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> list[str]:
    """Writes the files beside the weights into checkpoint directory `path`: those of the directory the
    tokenizer was loaded from (COMPANION_FILES, its named chat templates and license files), copied as
    they are; what that directory lacks (or all, for a tokenizer made in memory) from the tokenizer and
    the model's generation config. Where the harness renders with vivace's template, not the tokenizer's
    own (which cannot show tool calls as the harness reads them, or is missing), chat_template.jinja is
    that template: the format the model was trained in. Returns the names copied."""
    import shutil

    source = Path(tokenizer.name_or_path) if tokenizer.name_or_path else None
    copied = []
    if source is not None and source.is_dir() and source.resolve() != path.resolve():
        for file in sorted(source.iterdir()):
            if file.is_file() and (file.name in COMPANION_FILES or _LICENSE_FILE.match(file.name)):
                shutil.copyfile(file, path / file.name)
                copied.append(file.name)
            elif file.name == "additional_chat_templates" and file.is_dir():
                shutil.copytree(file, path / file.name, dirs_exist_ok=True)
                copied.append(file.name)
    if "tokenizer_config.json" not in copied:
        tokenizer.save_pretrained(path)
    if "generation_config.json" not in copied and model.can_generate() and model.generation_config is not None:
        model.generation_config.save_pretrained(path)
    chat = _chat_format(tokenizer)
    if not chat.own_template:  # trained in vivace's format: what vLLM or transformers must prompt it with
        (path / "chat_template.jinja").write_text(chat.template)  # read before tokenizer_config.json's
    return copied


@functools.lru_cache(maxsize=4)  # one per tokenizer: a run saves many checkpoints, and each would warn again
def _chat_format(tokenizer: PreTrainedTokenizerBase):
    from vivace.harness.chat import ChatFormat

    return ChatFormat(tokenizer)


def ship_checkpoint(
    source: str | Path,
    dest: Path = TINY_DIR,
    dtype: torch.dtype = torch.bfloat16,
    *,
    allow_unfinished: bool = False,
    recipe: str | None = None,
) -> dict:
    """Copies a trained checkpoint into the package as `tiny` (weights rounded to `dtype`: half the
    bytes of fp32, and `load_model` computes in fp32 again), with `warm_start.json` saying where it
    came from (its `sft train` summary, `recipe` in words, and the record of what it replaces, as
    "previous"). Returns that record. Replaces the checkpoint `dest` held; on any error `dest` is left as
    it was. ValueError, before anything is written, for a `dest` that holds anything but a checkpoint
    (or holds `source`), a run that stopped short of its budget (unless `allow_unfinished`) or an
    unreadable summary."""
    import shutil

    source = Path(source)
    old, tmp = dest.with_name(dest.name + ".old"), dest.with_name(dest.name + ".new")
    if source.resolve().is_relative_to(dest.resolve()):
        raise ValueError(f"{source} is inside --dest {dest}, which shipping replaces; ship it into another directory")
    for path in (dest, old, tmp):  # each is removed or replaced below: only a checkpoint's own files may go
        if problem := _not_replaceable(path):
            raise ValueError(f"{path} {problem}; shipping replaces it, so give --dest a new directory or a "
                             "checkpoint directory to replace")  # fmt: skip
    sft_summary = _read_record(source / "sft_summary.json")
    if sft_summary is not None and sft_summary.get("finished") is not True and not allow_unfinished:
        at = f"step {sft_summary.get('step')}" + (f" of {p}" if (p := sft_summary.get("planned_steps")) else "")
        raise ValueError(f"{source} is from an `sft train` run that did not finish (stopped by "
                         f"{sft_summary.get('stopped_by') or 'a kill'}, at {at}); train it to the end, or ship it as "
                         "it is with --allow-unfinished")  # fmt: skip
    previous = _read_record(dest / "warm_start.json")
    loaded = load_model(str(source))
    model = loaded.model.to(dtype)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_checkpoint(model, loaded.tokenizer, tmp)
        for f in tmp.iterdir():  # safetensors writes its file 0600: the package's files are everyone's to read
            if f.is_file():
                f.chmod(0o644)
        record = {
            "source": str(source),
            **({"recipe": recipe} if recipe else {}),
            "dtype": str(dtype).removeprefix("torch."),
            "parameters": count_parameters(model),
            "sha256": hashlib.sha256((tmp / "model.safetensors").read_bytes()).hexdigest(),
            "sft_summary": sft_summary,
            # what it replaces, without that one's own summary and history: the lineage a step at a time
            "previous": {k: v for k, v in previous.items() if k not in ("sft_summary", "previous")}
            if previous
            else None,
        }
        (tmp / "warm_start.json").write_text(json.dumps(record, indent=2) + "\n")
        # The old one aside, the new one in, then the old one removed: a kill at any point leaves a whole
        # checkpoint at dest or beside it (spec.initialised refuses a missing one with one beside it), where
        # removing dest first and then renaming left `--model tiny` the untrained model, silently.
        shutil.rmtree(old, ignore_errors=True)
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return record


def _not_replaceable(path: Path) -> str | None:
    """Why `ship_checkpoint` must not remove `path`, or None: nothing there, an empty directory, or a
    checkpoint (config.json, beside files and the tokenizer's additional_chat_templates/ only), such as
    an earlier ship or one a killed ship left beside it. A user's own directory given as --dest was
    removed whole, the checkpoint being shipped with it when it lay inside."""
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_dir():
        return "is not a directory"
    entries = list(path.iterdir())
    if not entries:
        return None
    if not (path / "config.json").is_file():
        return "holds files and is not a checkpoint (no config.json)"
    others = [e.name for e in entries if not (e.is_file() or e.name == "additional_chat_templates")]
    return f"holds more than a checkpoint ({', '.join(sorted(others)[:3])})" if others else None


def _read_record(path: Path) -> dict | None:
    """A JSON object from `path` (None if there is none); ValueError naming the file if it cannot be read."""
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it ({e}); fix it, or move it aside to ship without it") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a JSON object; fix it, or move it aside to ship without it")
    return record


def count_parameters(model: PreTrainedModel) -> dict[str, int]:
    """Total parameters, and those a token passes through (top-k of the experts, for MoE models)."""
    total = sum(p.numel() for p in model.parameters())
    cfg = model.config
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    n_experts, top_k = getattr(cfg, "num_experts", 0) or 0, getattr(cfg, "num_experts_per_tok", 0) or 0
    active = total - experts + (experts * top_k // n_experts if n_experts else 0)
    return {"total": total, "active": active}
