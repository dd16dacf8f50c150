"""The trainer's step in fp32 and in bf16 (`train.param_dtype`, FSDP2 mixed precision), side by side: time,
peak memory, and how far the bf16 forward's logprobs are from the fp32 one's.

    .venv/bin/python scripts/bench_trainer_precision.py [--model tiny | --layers 6 --hidden 512] [--rounds 2]

One rank, a fixed batch of rollouts shaped like an agent's (a shared prompt, then generated tokens mixed
with tool output), one process per measurement, the two precisions alternating round by round (noisy
machines). The logprob gap is what the sampler-to-trainer importance weight sees when the sampler runs
fp32 and the trainer bf16. Results as JSON on the last line (docs/benchmarks.md, "The trainer in bf16").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_trainer_memory import MEMORY_WATCH, make_checkpoint  # noqa: E402

RANK = r"""
import random
import torch
from vivace.config import TrainConfig
from vivace.rl.trainer import Sample, Trainer
time.sleep(0.02)
base = anon_mb()  # after imports: the peak counts the model, its optimizer and the steps
model, dtype, steps, samples_n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
trainer = Trainer(model, TrainConfig(model=model, lr=1e-5, param_dtype=dtype, micro_batch_tokens=4096))
rng = random.Random(0)
vocab = trainer.model.config.vocab_size
prompt = [rng.randrange(7, vocab) for _ in range(512)]
def sample(adv):
    n = rng.randrange(600, 1400)
    mask = [0] * len(prompt) + [int(rng.random() < 0.3) for _ in range(n)]
    ids = prompt + [rng.randrange(7, vocab) for _ in range(n)]
    return Sample(ids, mask, [-5.0 * m for m in mask], [0 if m else -1 for m in mask], adv)
batch = [sample(1.0 if i % 2 else -1.0) for i in range(samples_n)]
from transformers import AutoModelForCausalLM
from vivace.rl.packing import PACKED
def fp32_logprobs():  # the weights as the sampler gets them (full_state_dict, fp32), in an fp32 forward
    plain = AutoModelForCausalLM.from_config(trainer.config, dtype=torch.float32)
    plain.load_state_dict(trainer.full_state_dict(), strict=False)
    plain.tie_weights()
    plain.set_attn_implementation(PACKED)
    with torch.no_grad():
        rows = [trainer._forward(m, plain) for m in trainer._micro_batches(batch)]
    return torch.cat([r[0] for r in rows]), torch.cat([r[4] for r in rows])  # logprobs, advantages
with torch.no_grad():  # the trainer's own logprobs, in its precision (rows packed alike in both runs)
    torch.save(torch.cat([trainer._forward(m)[0] for m in trainer._micro_batches(batch)]), out)
before, advantages = fp32_logprobs()
times = []
for _ in range(steps + 1):  # the first is a warm-up
    t0 = time.perf_counter()
    trainer.train_step(batch)
    times.append(time.perf_counter() - t0)
peak = max(high[0], anon_mb()) - base
after = fp32_logprobs()[0]
moved = float(((after - before) * advantages).mean())  # up where the advantage is positive, down where not
tokens = sum(len(s.ids) for s in batch)
print(json.dumps({"step_s": times[1:], "tokens": tokens, "peak_mb": peak, "moved": moved}))
"""


def run(model: str, dtype: str, steps: int, samples: int, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", MEMORY_WATCH + RANK, model, dtype, str(steps), str(samples), str(out)],
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"the {dtype} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="A checkpoint (tiny or a directory); default: a Qwen3-MoE made for the run.")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8, help="Rollouts in the batch.")
    parser.add_argument("--steps", type=int, default=3, help="Timed steps per run (after one warm-up).")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import torch

    tmp = Path(tempfile.mkdtemp(prefix="trainer-precision-"))
    model = args.model
    if model is None:
        model = str(tmp / "model")
        params = make_checkpoint(Path(model), args.layers, args.hidden)
        print(f"model: a Qwen3-MoE of {params / 1e6:.0f}M parameters", flush=True)
    runs: dict[str, list[dict]] = {"float32": [], "bfloat16": []}
    for r in range(args.rounds):
        for dtype in runs:
            got = run(model, dtype, args.steps, args.samples, tmp / f"{dtype}.pt")
            runs[dtype].append(got)
            print(f"round {r + 1} {dtype:>8}: step {statistics.median(got['step_s']):.2f} s, "
                  f"peak {got['peak_mb']:.0f} MB above imports", flush=True)  # fmt: skip
    fp32, bf16 = (torch.load(tmp / f"{d}.pt") for d in runs)
    gap = bf16 - fp32
    summary = {
        d: {
            "step_s": round(statistics.median(s for g in got for s in g["step_s"]), 3),
            "tokens_per_s": round(got[0]["tokens"] / statistics.median(s for g in got for s in g["step_s"])),
            "peak_mb": round(max(g["peak_mb"] for g in got)),
            "logprob_moved": round(got[-1]["moved"], 4),
        }
        for d, got in runs.items()
    }
    summary["bf16_vs_fp32"] = {
        "speed": round(summary["float32"]["step_s"] / summary["bfloat16"]["step_s"], 2),
        "memory": round(summary["bfloat16"]["peak_mb"] / max(summary["float32"]["peak_mb"], 1), 2),
        "logprob_abs_gap_mean": round(float(gap.abs().mean()), 4),
        "logprob_abs_gap_p99": round(float(gap.abs().quantile(0.99)), 4),
        "kl_k3": round(float((torch.exp(gap) - 1 - gap).mean()), 5),
    }
    print(json.dumps({"model": args.model or f"moe {args.layers}x{args.hidden}", **summary}))


if __name__ == "__main__":
    main()
