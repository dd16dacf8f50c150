"""Shared fixtures: a small repository, backends, and a factory that makes workspaces over it.

`make_workspace` is parametrized over every Workspace implementation, so one contract suite
(test_workspace.py) checks them all the same way; "http" is the HTTP client talking to a
real uvicorn server (one per session, in a background thread on 127.0.0.1).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI

from vivace.config import PoolConfig, SandboxConfig
from vivace.harness.chat import ChatFormat
from vivace.model.tokenizer import train_tokenizer
from vivace.sandbox.isolated import probe
from vivace.sandbox.paths import ConfinedFS

# The Ctrl-C tests send SIGINT as a terminal would. A background job or nohup starts pytest with it
# ignored, and Python then raises no KeyboardInterrupt: restore the default, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (make test): a worker per core this process may use, at most 4. Each worker loads its
    own session fixtures and often torch, so more would cost memory more than they save time."""
    return min(4, len(os.sched_getaffinity(0)))


ISOLATION_PROBLEM = probe()
needs_isolation = pytest.mark.skipif(ISOLATION_PROBLEM is not None, reason=f"isolated backend: {ISOLATION_PROBLEM}")

REPO_FILES = {
    "README.md": "# demo\n",
    "pkg/__init__.py": "",
    "pkg/calc.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "tests/test_calc.py": "from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "data/blob.bin": "\x00\x01\x02binary",
}


def wait_for_idle_ray(timeout_s: float = 30.0) -> None:
    """Waits (up to `timeout_s`) until this process's Ray cluster has every CPU free: an earlier test's
    actors give theirs back late, and a run that starts meanwhile waits for CPUs with fewer steps done."""
    import time

    import ray

    if not ray.is_initialized():
        return
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture(scope="session")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for rel, text in REPO_FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    os.symlink("calc.py", root / "pkg" / "alias.py")
    return root


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("state")


def sandbox_config(state_dir: Path, backend: str, **kw) -> SandboxConfig:
    return SandboxConfig(backend=backend, state_dir=state_dir, **kw)


def make_backend(kind: str, state_dir: Path):
    """A real backend on the test state dir; skips when the isolated one cannot run here."""
    if kind == "isolated":
        if ISOLATION_PROBLEM:
            pytest.skip(f"isolated backend: {ISOLATION_PROBLEM}")
        from vivace.sandbox.isolated import IsolatedBackend

        return IsolatedBackend(sandbox_config(state_dir, "isolated", memory_mb=256, pids_max=64, disk_mb=64, tmp_mb=32))
    from vivace.sandbox.plain import PlainBackend

    return PlainBackend(sandbox_config(state_dir, "plain"))


@pytest.fixture
async def isolated_backend(state_dir):
    backend = make_backend("isolated", state_dir)
    yield backend
    await backend.aclose()


@pytest.fixture
async def plain_backend(state_dir):
    backend = make_backend("plain", state_dir)
    yield backend
    await backend.aclose()


@pytest.fixture
async def plain_ws(plain_backend, repo):
    """A plain-backend workspace of the bundled test repo (for tests of the loop, not of isolation)."""
    return await plain_backend.create(plain_backend.snapshot(str(repo)))


@dataclass
class EnvServer:
    url: str
    token: str
    app: FastAPI


# Enough live workspaces for the 200-client burst to flow, few enough creations at once
# that a 2-core machine is not thrashed by mounts and copies.
HTTP_POOL = PoolConfig(max_live=64, create_concurrency=4)
SERVER_TOKEN = "test-token-" + os.urandom(8).hex()


@pytest.fixture(scope="session")
def env_server(state_dir):
    """A real environment server for the whole session: isolated backend if possible, else plain."""
    from vivace.sandbox.background import BackgroundServer
    from vivace.sandbox.server import create_app

    # Its own state dir, so that what the server leaves behind is easy to tell apart.
    backend = make_backend("plain" if ISOLATION_PROBLEM else "isolated", state_dir / "http-server")
    app = create_app(backend, HTTP_POOL, SERVER_TOKEN, own_backend=True)
    server = BackgroundServer(app).start()
    yield EnvServer(server.url, SERVER_TOKEN, app)
    server.stop()


@pytest.fixture(params=["isolated", "plain", "http"])
async def make_workspace(request, repo, state_dir):
    """An async factory: `ws = await make_workspace()` gives a fresh workspace over `repo`."""
    if request.param == "http":
        from vivace.sandbox.client import EnvClient

        server = request.getfixturevalue("env_server")
        client = EnvClient(server.url, server.token)
        made = []

        async def make_remote():
            made.append(await client.create(str(repo)))
            return made[-1]

        yield make_remote
        for ws in made:  # the server is shared by the session: leave nothing behind
            await ws.close()
        await client.aclose()
        return
    backend = make_backend(request.param, state_dir)
    snapshot = backend.snapshot(str(repo))

    async def make():
        return await backend.create(snapshot)

    yield make
    await backend.aclose()


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs: writes past it fail with ENOSPC (root only, as the isolated sandbox's tests)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "full"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield where
    subprocess.run(["umount", "-l", str(where)])


@pytest.fixture(scope="session")
def chat_format() -> ChatFormat:
    """A ChatFormat over a small byte-level BPE (800 tokens) trained here on a few KB of this
    project's code, the way the reference tokenizer is trained (vivace.model.tokenizer), but with
    no template of its own (so ChatFormat uses QWEN_TEMPLATE)."""
    src = Path(__file__).resolve().parents[1] / "src" / "vivace" / "harness"
    corpus = [(src / f).read_text()[:4000] for f in ("messages.py", "tools/base.py")]
    corpus.append("Let me look at the file. Les résultats sont prêts: 结果 ✓ — done.\n" * 20)
    tokenizer = train_tokenizer(corpus, 800)
    tokenizer.chat_template = None
    return ChatFormat(tokenizer)


def unprivileged() -> list[str]:
    """A command prefix under which file permissions hold: none for a user; for root, root without
    its capabilities to override them (skips the test where setpriv cannot drop them)."""
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    prefix = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("needs setpriv to drop root's file-permission override")
    return prefix


async def benchmark_episodes(state_dir: Path, *episodes) -> list:
    """(trajectory, score) of each (policy, task) in `episodes`, run as the benchmark and RL run an
    episode (bench.runner.run_task: setup, the agent, scoring), on the plain backend."""
    from vivace.bench.runner import run_task
    from vivace.config import load_preset
    from vivace.sandbox import open_backend

    cfg = load_preset("default", sandbox={"backend": "plain", "state_dir": str(state_dir)})
    backend = open_backend(cfg.sandbox)
    try:
        return [await run_task(policy.for_task(task), task, cfg, backend) for policy, task in episodes]
    finally:
        await backend.aclose()


def vivace_refusal(*args: str) -> tuple[int, bool, str]:
    """`vivace ARGS` in a fresh interpreter: (exit code, whether torch got imported, stderr). A refusal
    that needs only the arguments should come before the seconds of importing torch and transformers."""
    probe = ("import sys\nfrom vivace.cli import main\nsys.argv = ['vivace', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120)
    said = run.stdout.split()
    assert len(said) == 3 and said[0] == "exit", run.stdout + run.stderr[-2000:]
    return int(said[1]), said[2] == "True", run.stderr


def git(repo: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    """git in `repo` with an author and committer set (a fresh machine has neither)."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, input=input, env=env)


class DirWorkspace:
    """What export_changes reads of a workspace (stat, read_bytes, its tree), over a plain directory."""

    def __init__(self, root: Path):
        self.fs = ConfinedFS(root)

    async def stat(self, path: str):
        return self.fs.stat(path)

    async def read_bytes(self, path: str) -> bytes:
        return self.fs.read_bytes(path)

    async def readlink(self, path: str) -> str:
        return self.fs.readlink(path)
