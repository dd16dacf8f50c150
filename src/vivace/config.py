"""Typed run configuration and named presets.

Each component owns a small pydantic model with a description on every field; the
top-level `VivaceConfig` only composes them. Presets are named starting points
(`--preset tiny`); an unknown name fails with the list of valid ones. Invalid values fail
at construction with a message naming the field.

Later components (model, inference, rl) add their own sections here as they land.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator
from pydantic_core import ErrorDetails


def cache_root() -> Path:
    """vivace's machine-wide cache folder: $XDG_CACHE_HOME/vivace (~/.cache/vivace)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vivace"


def default_state_dir() -> Path:
    """Where machine-wide sandbox state lives (snapshot cache, workspaces): $VIVACE_STATE_DIR or ~/.cache."""
    env = os.environ.get("VIVACE_STATE_DIR")
    return Path(env) if env else cache_root() / "sandbox"


class _Strict(BaseModel):
    # allow_inf_nan=False: JSON's Infinity/NaN and TOML's inf/nan are refused in every float setting (a weight of
    # inf made NaN scores; a timeout of inf an OverflowError in every episode), naming the setting.
    # strict: a value of another type is refused, naming the setting, rather than converted: `"steps": true` ran
    # 1 step and `"max_turns": "8"` passed as 8. An int is still a float; paths are read from strings (PathSetting).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


def _no_nul(path: Path) -> Path:
    if "\0" in str(path):  # no file system allows it: the first use would fail with "embedded null byte"
        raise ValueError("a path cannot hold a NUL character")
    return path


PathSetting = Annotated[Path, Strict(False), AfterValidator(_no_nul)]  # a path's JSON or TOML value is a string


# The devices the engine runs on (inference.samplers.resolve_device, which also checks that torch sees it);
# checked here without torch, so that a typo stops the command when its config loads.
_DEVICE = re.compile(r"auto|cpu|(cuda|mps|xpu)(:\d+)?")


def check_device(device: str) -> str:
    """`device` if it is one the engine can be placed on by name, else ValueError saying which are."""
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N (mps or xpu where torch has them)")
    return device


class SandboxConfig(_Strict):
    """How workspaces are made and how commands inside them are confined."""

    backend: Literal["auto", "isolated", "plain"] = Field(
        "auto",
        description="isolated: namespaces+overlayfs+cgroups (needs root and bubblewrap); "
        "plain: directory copy + rlimits, NOT isolated; auto: isolated when available, "
        "else plain with a loud warning.",
    )
    state_dir: PathSetting = Field(
        default_factory=default_state_dir,
        description="Snapshot cache and live workspaces; shared by every process on the machine.",
    )
    memory_mb: int = Field(2048, ge=16, description="Memory limit per workspace (cgroup), MiB.")
    pids_max: int = Field(256, ge=8, description="Maximum processes+threads per workspace.")
    cpus: float = Field(1.0, gt=0, description="CPU quota per workspace, in cores.")
    disk_mb: int = Field(1024, ge=1, description="Size of a workspace's writable layer, MiB.")
    tmp_mb: int = Field(256, ge=1, description="Size of the private /tmp inside the sandbox, MiB.")
    timeout_s: float = Field(120.0, gt=0, description="Default wall-clock limit per command, s.")
    output_limit_bytes: int = Field(
        256 * 1024, ge=1024, description="Bytes kept per stream (stdout, stderr); the rest is counted and dropped."
    )
    toolchain: list[PathSetting] = Field(
        default_factory=list,
        description="Directories mounted read-only at the same path inside the sandbox (a "
        "virtualenv, an interpreter prefix); their bin/ goes first on PATH. Empty: the "
        "running Python's environment.",
    )
    sandbox_uid: int = Field(65534, ge=1, description="Unprivileged uid commands run as (isolated backend).")
    sandbox_gid: int = Field(65534, ge=1, description="Unprivileged gid commands run as (isolated backend).")
    diff_ignore: list[str] = Field(
        default_factory=lambda: [".git", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".mypy_cache"],
        description="Path components (fnmatch patterns) left out of workspace diffs.",
    )


class PoolConfig(_Strict):
    """How many workspaces exist at once and how fast they are made."""

    max_live: int = Field(64, ge=1, description="Cap on live workspaces; callers wait beyond it.")
    create_concurrency: int = Field(8, ge=1, description="Workspaces created at the same time.")
    warm: int = Field(0, ge=0, description="Workspaces kept ready in advance.")


class ServerConfig(_Strict):
    """The environment server (HTTP)."""

    host: str = Field("127.0.0.1", description="Bind address; loopback by default.")
    port: int = Field(8765, ge=0, le=65535, description="TCP port (0 picks a free one).")
    token: str | None = Field(
        None, description="Bearer token clients must send; None: $VIVACE_SANDBOX_TOKEN or a random one."
    )
    max_exec_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="The longest timeout a client may ask for one command, s (never below sandbox.timeout_s); "
        "a longer one is refused: it would only keep a workspace and its pool slot from everybody else.",
    )
    max_file_streams: int = Field(
        256,
        ge=1,
        description='File reads streamed at once (files over 256 KiB); one more is refused with 503 "busy" '
        "until one ends. Each holds an open file and up to ~0.5 MiB of buffers.",
    )
    file_stream_stall_s: float = Field(
        60.0,
        gt=0,
        description="How long a streamed file read waits for its client to take the next piece, s; then it is "
        "abandoned (its file closed, the client sees an incomplete response), as nginx's send_timeout.",
    )
    workspace_idle_s: float = Field(
        1800.0,
        ge=0,
        description="A workspace handed out and untouched by any request for this long is closed, s (0: never): "
        "a client that crashed, or gave up on a create the server completed, would otherwise hold it and its "
        "pool slot until the server stops. A running command or streamed read counts as a request.",
    )
    max_diff_chars: int = Field(
        64 << 20,
        ge=1,
        description='The largest workspace diff sent, in characters; a larger one is refused (413 "too_large"): '
        "it is built and sent whole, and the server holds several times its size meanwhile.",
    )


class AgentConfig(_Strict):
    """Limits of one agent episode (the same for `vivace agent`, the benchmark and RL rollouts)."""

    max_turns: int = Field(50, ge=1, description="Assistant turns before the episode stops (stop reason max_turns).")
    max_tokens: int = Field(
        65_536,
        ge=256,
        description="Tokens in the whole conversation (prompt + generated), as the policy reports them; "
        "beyond it the episode stops (max_tokens).",
    )
    max_turn_tokens: int = Field(4096, ge=16, description="Tokens one assistant turn may generate.")
    max_tool_calls_per_turn: int = Field(
        32, ge=1, description="Tool calls run per turn; calls beyond it get an error result and are not run."
    )
    max_wall_s: float = Field(1800.0, gt=0, description="Wall-clock seconds for the episode (stop reason timeout).")
    command_timeout_s: float = Field(120.0, gt=0, description="Default timeout of run_terminal_cmd, s.")
    max_result_chars: int | None = Field(
        None,
        ge=500,
        description="Characters one tool result may hold; the rest is cut from its middle, saying how much. None: "
        "20,000, or 3/4 of the model's context in tokens where that is less: the context its checkpoint's "
        "config.json declares, or an endpoint's model card (max_model_len, as vLLM and vivace serve list it). "
        "6,144 for the tiny policy's 8,192, so that one test report cannot fill a small model's context.",
    )
    reproducible_output: bool = Field(
        False,
        description="Commands run with PYTHONHASHSEED=0 (set and dict order, e.g. in pytest's assertion diffs) and "
        "their output's wall-clock durations (pytest's `in 0.16s`, unittest's `Ran 3 tests in 0.002s`) and object "
        "addresses (`<Circle object at 0x7f9b25b6ccd0>`) are written as fixed values, so the same policy, task and "
        "seed give the same episode and paired before/after "
        "comparisons stay paired past the first test run. For benchmarks and training; the product runs commands "
        "and shows their output as they are.",
    )


class ScoreConfig(_Strict):
    """Weights of the benchmark score, which is also the RL reward:

    total = correctness * (correctness_w + adherence_w * adherence + efficiency_w * efficiency)
            - claims_w * (1 - claims) - format_w * (1 - format)

    Adherence and efficiency only count for a correct result (a fast wrong answer earns
    nothing); unsupported claims and malformed output are penalties whatever the outcome."""

    correctness: float = Field(1.0, ge=0, description="Weight of solving the task (hidden tests pass).")
    adherence: float = Field(0.3, ge=0, description="Weight of adherence to the codebase (0..1 score).")
    efficiency: float = Field(0.2, ge=0, description="Weight of efficiency: few turns, parallel calls, few tokens.")
    claims: float = Field(
        0.2, ge=0, description="Penalty weight for claims in the answer the trajectory does not back."
    )
    format: float = Field(0.1, ge=0, description="Penalty weight for malformed tool calls.")
    target_turns: int = Field(4, ge=1, description="Turns at or under which the turn part of efficiency is 1.")
    target_calls_per_turn: float = Field(2.0, gt=0, description="Tool calls per turn at which that part is 1.")
    target_tokens: int = Field(2000, ge=1, description="Completion tokens at or under which the token part is 1.")


class EngineConfig(_Strict):
    """The sampling engine (inference/engine.py) and how it samples for the agent."""

    max_batch: int = Field(32, ge=1, description="Sequences generating at once (continuous batching).")
    max_step_tokens: int = Field(
        2048, ge=16, description="Tokens fed per engine step; long prompts are prefilled in chunks within it."
    )
    prefix_cache_tokens: int = Field(
        65_536, ge=0, description="Positions of finished sequences kept for prefix reuse (0: no prefix cache)."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights and activations.")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto (cuda when available).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature for agent turns (0: greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Top-k cut (0: none).")
    # torch.manual_seed's range: a larger seed overflows only when a run starts its engine.
    seed: int = Field(0, ge=-(2**63), le=2**64 - 1, description="Seed of the engine's sampling generator.")

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        return check_device(device)


class TrainConfig(_Strict):
    """RL training (`vivace train`): what is rolled out, how it is judged, how the policy is updated."""

    model: str = Field("tiny", description="The policy to train: tiny or a checkpoint directory.")
    suite: str = Field(
        "bundled",
        description="Task suite the rollouts are drawn from (vivace.tasks.suites), or a tasks file/directory.",
    )
    split: Literal["train", "validation", "test"] | None = Field(
        "train", description="Split of the suite to train on (by repository); None: all."
    )
    tasks_per_step: int = Field(4, ge=1, description="Tasks (groups) rolled out per step.")
    group_size: int = Field(4, ge=2, description="Rollouts per task (G): advantages are relative to the group.")
    steps: int = Field(20, ge=1, description="Optimizer steps in the run.")
    rollout_concurrency: int = Field(8, ge=1, description="Episodes running at once (over all rollout workers).")
    pipeline: Literal["sync", "async"] = Field(
        "sync",
        description="sync: a step's groups start together and the next step's start after the weight update "
        "(batch barrier); async: rollouts never stop, the trainer takes the first complete groups, at most "
        "max_staleness versions ahead of what they were sampled with.",
    )
    partial_episodes: Literal["continue", "abort"] = Field(
        "continue",
        description="Episodes in flight at a weight update: continue on the new weights (per-token versions "
        "recorded) or abort and re-queue them. Either way an episode that can no longer be trained within "
        "max_staleness is aborted and re-queued at once.",
    )
    sampler_replicas: int = Field(
        1, ge=1, description="Sampler (inference engine) replicas; episodes go to the least loaded."
    )
    max_attempts: int = Field(
        3, ge=1, description="Attempts of an episode whose environment failed before it counts as a failed rollout."
    )
    advantage: Literal["mean", "std", "loo"] = Field(
        "mean", description="Group baseline: mean-centred, std-normalised, or leave-one-out."
    )
    mask_truncated: bool | Literal["solved"] = Field(
        False,
        description="Episodes cut off by a limit count in their group's baseline but get no loss. `solved`: only "
        "those that solved the task (a fix followed by looping until max_turns is not reinforced), while "
        "failures cut off by a limit are still pushed down.",
    )
    group_filter: Literal["reward", "correctness", "solved"] = Field(
        "reward",
        description="Which groups train: reward: any whose rewards differ; correctness: only those whose "
        "rollouts differ in outcome: some solved the task and some did not, or (with milestone rewards on) "
        "some reached a milestone and some did not. When success is rare, the small penalty differences "
        "between failed rollouts otherwise teach the policy to stop acting (do nothing, be penalised for nothing). "
        "solved: correctness, plus groups whose rollouts all solved the task and differ in reward (efficiency, "
        "adherence, claims, format): how to solve well, a direction shared across tasks where the split groups' "
        "is not (docs/benchmarks.md).",
    )
    solved_mask_answer: bool = Field(
        False,
        description="In a group whose rollouts all solved the task (kept by group_filter solved or reward), "
        "leave each rollout's final turn out of the loss: the turns that got there faster still train, the "
        "decision to answer does not (trained, it became answering early with a false claim; docs/benchmarks.md).",
    )
    milestone_read: float = Field(
        0.0,
        ge=0,
        description="Training-only reward for a rollout that read a non-test file (read_file succeeded: the path "
        "was copied right). Added to the benchmark score for the advantage, never to the benchmark itself; "
        "unsolved rollouts differ in it, so groups that all failed still teach the steps towards a fix.",
    )
    milestone_edit: float = Field(
        0.0,
        ge=0,
        description="Training-only reward for a rollout whose edit of a non-test file applied (edit_file found "
        "its old_string: the text was copied right), solved or not.",
    )
    mask_malformed: bool = Field(
        True,
        description="A rollout with a positive advantage is not trained on its turns with a malformed tool call "
        "or cut off at the turn's token limit: a success must not teach the broken call it recovered from. "
        "Negative advantages still push those turns down.",
    )
    loss_aggregation: Literal["token", "sequence"] = Field(
        "token",
        description="How a step's rollouts weigh in the loss. token: every generated token alike, so a rollout "
        "weighs by its length; sequence: every rollout alike (its tokens share its advantage). With token "
        "weighting, failed rollouts that run to max_turns are longer than the successes, so on the tokens every "
        "rollout writes (the call format) the group's advantages no longer cancel and the failures push them down.",
    )
    negative_scale: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Weight of negative advantages (1: plain policy gradient; 0: learn only from rollouts better "
        "than their group, as in filtered imitation). Below 1 the update leans on the rare successes instead "
        "of pushing down the many failures' tokens, which flattens a small policy's distribution.",
    )
    replay: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of the groups that replay a task whose last group split on success (some rollouts "
        "solved it, some not), oldest first, instead of a fresh task. When success is rare, only such groups "
        "train; replaying them gives the update more of them and lets the policy improve where it can.",
    )
    replay_limit: int = Field(
        3,
        ge=1,
        description="Most replays of one task: a short queue otherwise hands back the same task again and again.",
    )
    families: list[str] | None = Field(
        None,
        description="Train only on tasks of these families (task metadata `family`, else `kind`); None: all. "
        "The held-out evaluation still covers every family.",
    )
    task_ids: list[str] | None = Field(
        None,
        description="Train only on these tasks of the suite (ids, after `families`); None: all. A few tasks seen "
        "again and again are learnt; with the tiny warm start that did not carry over to held-out tasks "
        "(docs/benchmarks.md, RL from h2, eighth round).",
    )
    max_staleness: int = Field(
        0, ge=0, description="Oldest policy version (behind the trainer's) a token may come from; 0: on-policy."
    )
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_eps: float = Field(
        1e-8,
        gt=0,
        description="AdamW's epsilon. In a short run Adam is in its sign regime (every parameter with any "
        "gradient moves by about lr per step); an epsilon near the typical per-parameter gradient keeps the "
        "many parameters with tiny, noisy gradients nearly still, so the update goes where the samples point.",
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    clip_low: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="PPO clip range below 1: the ratio is clipped from below at 1 - clip_low, which must stay "
        "above 0 (a ratio of probabilities is positive). The ratio is the trainer's against its own weights at the "
        "start of the update, and the trainer makes one update per batch, so it is 1 and the clip never acts; "
        "the sampler's staleness is is_cap's to bound.",
    )
    clip_high: float = Field(
        0.28,
        ge=0,
        description="PPO clip range above 1 (clip-higher); like clip_low, it never acts with one update per batch.",
    )
    is_cap: float = Field(2.0, ge=1, description="Cap of the sampler-to-trainer importance weight (truncated IS).")
    kl_coef: float = Field(0.0, ge=0, description="KL to the initial policy (k3); 0: off.")
    sft_data: PathSetting | None = Field(
        None,
        description="Expert episodes (a `vivace sft data` JSONL file) whose supervised loss is added to every "
        "update, weighted by sft_coef: it holds the policy near what the warm start learnt (copying names it "
        "never meets in RL's tasks) while the policy gradient moves it. None: off.",
    )
    sft_expert: int = Field(
        0,
        ge=0,
        description="When sft_data is None: record the efficient expert on this many of the run's training tasks "
        "at its start, plus a copy of each with the package renamed, as sft_data (run_dir/expert.jsonl). 0: off.",
    )
    sft_coef: float = Field(1.0, ge=0, description="Weight of the supervised loss on sft_data (mean over its tokens).")
    sft_episodes: int = Field(
        4,
        ge=1,
        description="Expert episodes from sft_data per update (taken in a shuffled cycle; at most all of them).",
    )
    micro_batch_tokens: int = Field(8192, ge=64, description="Tokens per forward/backward micro-batch.")
    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Precision of the trainer's forward and backward (FSDP2 mixed precision). bfloat16: each "
        "layer's parameters are gathered in bf16 for its computation, while the sharded weights, AdamW's state, "
        "the gradient reduction and what the sampler and checkpoints get stay fp32. GPUs' bf16 matrix units are "
        "many times faster than their fp32 ones; on a CPU with AVX512-BF16 a step took 1.13-1.65x less time, and "
        "memory grew with every new rollout shape (docs/benchmarks.md): use it on GPUs. An fp32 sampler's logprobs "
        "then differ from the trainer's (k3 up to 0.005 a token on the tiny preset's rollouts); the truncated "
        "importance weight takes that up.",
    )
    trainer_ranks: int = Field(1, ge=1, description="Trainer processes (FSDP2 ranks; one GPU each when GPUs exist).")
    rollout_workers: int = Field(1, ge=1, description="Rollout worker actors (each with its own workspace backend).")
    weight_sync: Literal["auto", "object_store", "broadcast"] = Field(
        "auto",
        description="How new weights reach the sampler (Ray): object_store (ray.put + fetch), broadcast "
        "(a collective from trainer rank 0: NCCL on GPU, gloo on CPU); auto: broadcast when every trainer rank and sampler replica has a GPU of its own.",
    )
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="Wall-clock budget: stop (with a checkpoint) after the step that leaves no room for another.",
    )
    total_minutes: float | None = Field(
        None,
        gt=0,
        description="Wall-clock budget of the whole run, the held-out evaluation after it included: RL stops "
        "(with a checkpoint) after the step that leaves too little time for another and the evaluation, "
        "projected from this run's rollout times. It keeps `vivace train`'s length on a slower machine.",
    )
    checkpoint_every: int = Field(5, ge=1, description="Save a resumable checkpoint every K steps (and at the end).")
    keep_checkpoints: int | None = Field(
        None,
        ge=1,
        description="Keep only the newest K checkpoints: older ones are deleted once a newer one is complete "
        "(a checkpoint holds the weights and the optimiser's state). None keeps them all.",
    )
    checkpoint_file_mb: int = Field(
        2048,
        ge=1,
        description="Largest weights file of a saved checkpoint, in MB. Trainer rank 0 writes the weights one "
        "file at a time as the ranks gather them, so it holds at most one file's worth (save_pretrained's "
        "default is 50 GB; a 30B model in fp32 is 120 GB).",
    )
    # int64, so the engines' seeds derived from it (seed + version + 1000 * replica) stay in torch's range.
    seed: int = Field(0, ge=-(2**63), le=2**63 - 1, description="Seed of the data order, sampling and initialisation.")
    runs_dir: PathSetting = Field(Path("runs"), description="Where run directories are made.")
    eval_tasks: int = Field(
        0, ge=0, description="Held-out tasks in the before/after benchmark that ends the run (0: no evaluation)."
    )
    eval_suite: str | None = Field(
        None, description="Suite (or tasks file) of the held-out benchmark; None: the training suite."
    )
    eval_split: Literal["train", "validation", "test"] = Field(
        "test", description="Split of the suite the held-out tasks come from (spread over task families)."
    )
    eval_baselines: list[str] = Field(
        default_factory=lambda: ["scripted:random-edit", "scripted:oracle"],
        description="Policies benchmarked beside the starting and the trained policy (floor and ceiling).",
    )
    eval_concurrency: int = Field(4, ge=1, description="Evaluation episodes running at once.")
    eval_samples: int = Field(
        1,
        ge=1,
        description="Episodes per held-out task and policy: at a sampling temperature, several make "
        "the success rate less noisy (and measure what RL optimises: success under sampling).",
    )
    eval_temperature: float | None = Field(
        None,
        ge=0,
        description="Sampling temperature of the before/after benchmark (None: the engine's; 0: greedy, "
        "so before and after differ by their weights only, not by sampling luck).",
    )


class VivaceConfig(_Strict):
    """The whole run configuration."""

    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    score: ScoreConfig = Field(default_factory=ScoreConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)


PRESETS: dict[str, dict] = {
    "default": {},
    # A laptop-sized run: small limits, few workspaces.
    "tiny": {
        "sandbox": {"memory_mb": 1024, "cpus": 1.0},
        "pool": {"max_live": 16, "create_concurrency": 4},
        # Reproducible output: a test run's duration and its assertion diffs' order were the only text in the
        # tools' results that differed between two runs of one episode, and they made paired episodes fork
        # (docs/benchmarks.md, sixth and seventh rounds).
        "agent": {"max_turns": 8, "max_tokens": 8192, "max_turn_tokens": 256, "reproducible_output": True},
        # Rollouts sample at 0.7: the small warm start's calls break more often at 1.0.
        "engine": {"max_batch": 16, "temperature": 0.7},
        # `make train`: the shipped warm start trained with RL on the learnable task families for
        # about 10 minutes (4 tasks x 4 rollouts per step; only groups split on success train: with
        # rare successes, penalties alone taught it to stop acting — docs/benchmarks.md), then the
        # before/after report on 56 held-out tasks (8 per family) beside the baselines, two episodes
        # each at the rollout temperature: success under sampling is what RL optimises. Eight tasks the
        # warm start solves sometimes, seen ~8 times each (`task_ids`, lr 5e-5), lowered held-out success
        # more than this stream of fresh tasks does (eighth round).
        "train": {
            "suite": "families",
            "families": [
                "misspelled_name",
                "misspelled_method",
                "self_comparison",
                "unused_loop_variable",
                "wrong_keyword",
                "misspelled_import",
            ],
            "tasks_per_step": 4,
            "group_size": 4,
            "group_filter": "correctness",
            "steps": 40,
            "max_minutes": 10.0,
            # make train within 25 minutes on a slower 2-core machine: setup 2-3 min, then recording, RL and
            # the evaluation (~11 min there) in 19; with 21 one run left 45 s to spare, with 20 one went 62 s past
            # its budget (the evaluation ran slower than projected) and ended at 23 min 22 s. On a faster
            # machine RL still gets its 10 minutes (docs/benchmarks.md).
            "total_minutes": 19.0,
            # A step's 16 episodes start together and share their system turn's prefill; 8 at a time
            # took 8-10% longer per step on 2 cores (docs/benchmarks.md).
            "rollout_concurrency": 16,
            # A solve that then loops until max_turns is not reinforced (it scores almost like a clean
            # one); a failure cut off by the limit is still pushed down.
            "mask_truncated": "solved",
            # 2e-4 wrecked the warm start within ~10 trained groups (held-out 5/56 -> 1/56); 6e-5 moved
            # it by noise (5 -> 4); 2e-5 leaves it as it was (5 -> 5). Higher rates, with the masks or a
            # larger Adam epsilon, lowered it or left it where it was. docs/benchmarks.md.
            "lr": 2e-5,
            # The supervised term beside the policy gradient: the expert on 50 training tasks and a renamed
            # copy of each, recorded at the start, 4 per update. Without it the preset's steps doubled the
            # greedy policy's malformed calls (96 -> 200 of 210 test tasks; 118 with it) and lowered held-out
            # success in most runs. With it, on all 210 test tasks x 2, three seeds leave success where it was
            # (124 -> 125, 123, 120 of 420) and make solved episodes faster, as the term alone does
            # (docs/benchmarks.md, twenty-fourth and twenty-fifth rounds). Those runs recorded 100 tasks; the
            # preset's ~12 updates take ~48 episodes, so 50 tasks (100 episodes) are still more than a run
            # uses, recorded in half the time (~1 minute instead of ~2 on 2 cores).
            "sft_expert": 50,
            "sft_episodes": 4,
            # The report and --resume need only the last; each holds ~90 MB (weights and Adam's state).
            "keep_checkpoints": 2,
            "eval_tasks": 56,
            "eval_samples": 2,
            # As many episodes at once as a rollout step: the report took 446 s against 608 s at 4, with
            # the same outcome in all 336 episodes (docs/benchmarks.md).
            "eval_concurrency": 16,
        },
    },
    # The smallest end-to-end check (CI): tight limits so runaway commands end fast.
    "smoke": {
        "sandbox": {"memory_mb": 512, "timeout_s": 30.0, "disk_mb": 256},
        "pool": {"max_live": 8, "create_concurrency": 4},
        "agent": {"max_turns": 8, "max_tokens": 8192, "max_turn_tokens": 512, "max_wall_s": 300.0},
        "train": {"tasks_per_step": 1, "group_size": 2, "steps": 2, "rollout_concurrency": 2, "checkpoint_every": 1},
    },
}


def load_preset(name: str, **overrides: dict) -> VivaceConfig:
    """Build a config from a named preset, with optional per-section overrides."""
    _check_preset(name)
    data: dict = {k: dict(v) for k, v in PRESETS[name].items()}
    for section, values in overrides.items():
        if not isinstance(values, dict):  # dict.update would take a string or a list of pairs as settings
            raise ValueError(f'"{section}" must be a table of settings')
        data.setdefault(section, {}).update(values)
    return VivaceConfig.model_validate(data)


def _check_preset(name: str) -> None:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (json.loads would keep the last silently; TOML refuses it)."""


class _Pairs(list):
    """A JSON object's (key, value) pairs as written, duplicates included."""


def _json_loads(text: str) -> object:
    """JSON as json.loads reads it, but a key given twice in one object is a DuplicateKey naming it by its
    dotted path (`train.steps`, or `train` for a section given twice) rather than the last one winning."""

    def unique(value: object, path: str) -> object:
        if isinstance(value, list) and not isinstance(value, _Pairs):
            return [unique(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, _Pairs):
            return value
        merged: dict = {}
        for key, item in value:
            where = f"{path}.{key}" if path else key
            if key in merged:
                raise DuplicateKey(f"{'section' if not path else 'setting'} {where!r} is given twice")
            merged[key] = unique(item, where)
        return merged

    return unique(json.loads(text, object_pairs_hook=_Pairs), "")


CONFIG_PARSERS = {".json": _json_loads, ".toml": tomllib.loads}


def load_config(preset: str, config_file: Path | None = None) -> VivaceConfig:
    """A preset, with a JSON or TOML file's sections merged over it. Every problem with the file
    is a ValueError naming it (and the setting, for a bad value)."""
    _check_preset(preset)  # first: the errors below are the file's, and say so
    if config_file is None:
        return load_preset(preset)
    parse = CONFIG_PARSERS.get(config_file.suffix.lower())
    if parse is None:
        raise ValueError(
            f"{config_file}: a config file must be .json or .toml (not {config_file.suffix or 'without a suffix'}); "
            "rename or convert it"
        )
    try:
        text = config_file.read_bytes().decode("utf-8-sig")  # -sig: a byte-order mark (Windows editors) is dropped
    except OSError as e:
        raise ValueError(
            f"{config_file}: cannot read it ({e.strerror}); give the path of a .json or .toml file"
        ) from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{config_file}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    if parse is _json_loads and not text.strip():
        raise ValueError(
            f'{config_file}: the file is empty; write a table of sections, e.g. {{"train": {{"steps": 10}}}}'
        )
    try:
        overrides = parse(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{config_file}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); fix the file's syntax"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{config_file}: not valid TOML ({e}); fix the file's syntax") from None
    except DuplicateKey as e:
        raise ValueError(f"{config_file}: {e}; give each setting once (merge the two)") from None
    except RecursionError:  # arrays nested thousands deep: no config is
        raise ValueError(f"{config_file}: nested too deeply to read; a config is a table of sections") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int limit)
        raise ValueError(f"{config_file}: cannot read it ({e}); fix the value") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"{config_file}: expected a table of sections (sandbox, agent, engine, train, ...)")
    try:
        return load_preset(preset, **overrides)
    except ValidationError as e:
        raise ValueError(f"{config_file}: {validation_message(e)}") from None
    except ValueError as e:
        raise ValueError(f"{config_file}: {e}") from None


def error_message(item: ErrorDetails) -> str:
    """pydantic's message for one error, less the "Value error, " it puts before a validator's own words."""
    return item["msg"].removeprefix("Value error, ")


def validation_message(error: ValidationError) -> str:
    """pydantic's errors as one line: each as `section.field: problem`, then where to look."""
    problems = []
    for item in error.errors():
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in item["loc"]).lstrip(".")
        said = error_message(item)
        if item["type"] == "extra_forbidden":
            said = "unknown section" if len(item["loc"]) == 1 else "unknown setting"
        problems.append(f"{where}: {said}" if where else said)
    return "; ".join(problems) + "; `vivace config show` lists every setting and its value"
