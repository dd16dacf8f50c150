"""`vivace serve` (the engine behind an OpenAI-compatible API) and `vivace serve bench`
(the engine against transformers' `generate`); registered on the app in cli.py."""

from __future__ import annotations

import contextlib
import gc
import json
from typing import Annotated

import typer

from vivace.cli import (
    app,
    bound_or_exit,
    err,
    fail,
    out,
    seed_in_range,
    sigterm_interrupts,
    status_say,
    stopped_by_signal,
)
from vivace.config import EngineConfig, error_message

serve_app = typer.Typer(help="Serve a model over an OpenAI-compatible API; `serve bench` measures the engine.")
app.add_typer(serve_app, name="serve")

ModelOpt = Annotated[str | None, typer.Option("--model", help="tiny, or a local checkpoint directory (required).")]
MaxBatchOpt = Annotated[int, typer.Option(min=1, help="Sequences generating at once.")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16.")]


@serve_app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    model: ModelOpt = None,
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    served_name: Annotated[
        str | None, typer.Option(help="Model name clients send (default: the --model spec).")
    ] = None,
    max_batch: MaxBatchOpt = 32,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
) -> None:
    """Serve MODEL: /v1/chat/completions (tools, streaming), /v1/completions (token ids + logprobs),
    /v1/models, /health, /metrics."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        fail("give --model (tiny or a checkpoint directory)")
    _check_model(model)
    sock = bound_or_exit(host, port)  # before the model loads, which can take minutes; --port 0: the port taken

    from vivace.inference.server import GRACEFUL_BACKSTOP_S, create_app
    from vivace.sandbox.background import ClosingServer, http_url, serving_config

    with sock:
        engine, chat = _engine(model, _engine_config(max_batch=max_batch, device=device, dtype=dtype))
        # What is loaded now stays until exit: out of the cyclic collector's reach, whose full passes
        # over it (~400,000 objects: torch, transformers) took 2-4 s at exit, after a Ctrl-C too.
        gc.collect()
        gc.freeze()
        name = served_name or model
        err.print(f"serving {name!r} on {http_url(host, sock.getsockname()[1])}/v1 (max batch {max_batch})",
                  markup=False, highlight=False)  # fmt: skip
        # SIGTERM or Ctrl-C: running requests get a second, then streams end with an error event and
        # whole replies with 503, their generation cancelled; a client that takes nothing is dropped.
        config = serving_config(
            create_app(engine, chat, name), log_level="warning", timeout_graceful_shutdown=GRACEFUL_BACKSTOP_S
        )
        try:
            with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is how it stops
                ClosingServer(config).run(sockets=[sock])
        finally:
            engine.close()


def _engine_config(**options) -> EngineConfig:
    """EngineConfig from command-line options; a bad value exits 2 naming the option."""
    from pydantic import ValidationError

    try:
        return EngineConfig(**options)
    except ValidationError as exc:
        problems = "; ".join(f"--{str(e['loc'][0]).replace('_', '-')}: {error_message(e)}" for e in exc.errors())
        fail(problems)


def _check_model(model: str) -> None:
    """Exit 2 when `model` names no model, before the engine's imports (torch, transformers: seconds)."""
    from vivace.model.spec import require_model

    try:
        require_model(model)
    except ValueError as exc:
        fail(str(exc))


def _engine(model: str, config: EngineConfig):
    from vivace.inference.samplers import local_engine

    try:
        return local_engine(model, config)
    except ValueError as exc:
        fail(str(exc))


@serve_app.command("bench")
def serve_bench(
    model: Annotated[str, typer.Option("--model", help="tiny, or a local checkpoint directory.")] = "tiny",
    n: Annotated[int, typer.Option("--n", min=1, help="Requests in the mixed-length workload.")] = 64,
    max_batch: MaxBatchOpt = 16,
    seed: Annotated[int, typer.Option(callback=seed_in_range, help="Workload seed.")] = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """The engine and transformers' `generate` on one model and one mixed-length workload, side by side."""
    _check_model(model)
    from vivace.inference import bench
    from vivace.inference.samplers import load_for_engine

    try:
        loaded = load_for_engine(model, _engine_config(device=device, dtype=dtype))
    except ValueError as exc:
        fail(str(exc))
    pad = loaded.tokenizer.pad_token_id or 0
    received: list[int] = []
    try:
        with err.status("benchmarking") as status, sigterm_interrupts(received):
            say = status_say(status)
            result = bench.run(loaded.model, n=n, max_batch=max_batch, seed=seed, pad_id=pad,
                               progress=lambda s: say(f"benchmarking: {s}"))  # fmt: skip
    except KeyboardInterrupt:
        raise stopped_by_signal(received, "no numbers: the benchmark was cut short; run it again, with a smaller "
                                "--n for a shorter one") from None  # fmt: skip
    result["model"] = model
    if as_json:
        print(json.dumps(result))
        return
    for side in ("engine", "transformers_generate"):
        r = result[side]
        out.print(
            f"{side:22} {r['tokens_per_s']:8.1f} tok/s  p50 {r['ms_per_token_p50']:7.2f} ms/token  "
            f"occupancy {r['batch_occupancy']:.2f}  ({r['tokens']} tokens in {r['wall_s']} s)"
        )
    out.print(f"throughput ratio (engine / generate): {result['throughput_ratio']}x")
