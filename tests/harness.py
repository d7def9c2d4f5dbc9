"""A real sglang server for tests: on the ``edgeacc_cpu`` platform, or on a CUDA GPU.

The server runs in its own process session so that stopping it takes the
whole tree (tokenizer, controller, schedulers, detokenizer, EdgeAcc sides)
down, also when the test that started it failed. On a GPU it runs with the
backends the GPU host's bundle provides (``--attention-backend triton
--sampling-backend pytorch``; ``scripts/gpu-host/build-bundle.sh``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil
import requests

from sglang_edgeacc.tiny_model import model_dir

# DP-attention launches start 4-5 processes that each import sglang: on a
# loaded 2-core CI machine that alone can take minutes.
STARTUP_TIMEOUT_S = float(os.environ.get("EDGEACC_TEST_STARTUP_TIMEOUT", "480"))
# Where each server's log is written (default: the system's temporary directory). The tests set it to a
# directory of pytest's own, which keeps the last three runs; the GPU scripts leave it to theirs.
SERVER_LOG_DIR_ENV = "EDGEACC_SERVER_LOG_DIR"


# A server binds ports derived from its HTTP port, some only well into its start: with DP attention the
# workers' handshake (port + DP_ATTENTION_HANDSHAKE_PORT_DELTA) and the distributed init port
# (port + ZMQ_TCP_PORT_DELTA) with the six ports after it. A test keeps up to four servers (paused, still
# bound) and starts two at once, so a port is handed out only when none of its derived ports meets a
# derived port of one handed out before in this process (those may not be bound yet), and each is
# bindable now. Ports the kernel hands out for outgoing connections come from the ephemeral range, where
# port + 233 could be taken by some connection meanwhile; servers get ports below it.
_SERVER_PORT_RANGE = (12000, 21500)  # upstream picks its NCCL ports from 22000 up
_HANDED_OUT: set[int] = set()  # every derived port of every server port this process handed out


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@functools.cache
def _derived_port_offsets() -> tuple[int, ...]:
    # Read when the first port is picked, not when the harness is imported (sglang takes seconds to import).
    from sglang.srt.server_args import DP_ATTENTION_HANDSHAKE_PORT_DELTA, ZMQ_TCP_PORT_DELTA

    return (0, DP_ATTENTION_HANDSHAKE_PORT_DELTA, *range(ZMQ_TCP_PORT_DELTA, ZMQ_TCP_PORT_DELTA + 8))


def free_port() -> int:
    """A server port whose derived ports are free, apart from every earlier one's, below the ephemeral range."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(*_SERVER_PORT_RANGE)
        derived = {port + offset for offset in _derived_port_offsets()}
        if derived.isdisjoint(_HANDED_OUT) and all(_bindable(p) for p in derived):
            _HANDED_OUT.update(derived)
            return port
    raise RuntimeError(f"no free server port in {_SERVER_PORT_RANGE} after 200 tries")


SHM_DIR = "/dev/shm"
# Shared-memory names that carry the pid of the process that created them: torch's
# (torch_<pid>_<random>_<n>) and upstream sglang's (sgl_shm_<kind>_<pid>_<random>).
_PID_STAMPED_SHM = (re.compile(r"torch_(\d+)_\d+_\d+"), re.compile(r"sgl_shm_\w+?_(\d+)_[0-9a-f]+"))


def shm_creator_pid(name: str) -> int | None:
    for pattern in _PID_STAMPED_SHM:
        match = pattern.fullmatch(name)
        if match:
            return int(match.group(1))
    return None


def shm_in_use(pids) -> set[str]:
    """Names under /dev/shm that the processes ``pids`` map or hold open (unlinked ones too)."""
    names = set()
    prefix = SHM_DIR + "/"
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.split(maxsplit=5)[5:]
                    if path and path[0].startswith(prefix):
                        names.add(path[0].strip()[len(prefix):].removesuffix(" (deleted)"))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    names.add(target[len(prefix):].removesuffix(" (deleted)"))
        except OSError:  # gone, or not ours to read
            continue
    return names


def shm_in_use_by_anyone() -> set[str]:
    return shm_in_use(int(entry) for entry in os.listdir("/proc") if entry.isdigit())


def cpu_server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SGLANG_PLATFORM="edgeacc_cpu",
        # A crashed scheduler otherwise keeps the launcher waiting 60 s for CUDA core dumps.
        SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS="0",
        PYTHONUNBUFFERED="1",
    )
    env.pop("SGLANG_CPU_OMP_THREADS_BIND", None)
    env.update(extra or {})
    return env


# The launch most CPU server tests share: one plain and one EdgeAcc server of it serve the whole
# session (tests/conftest.py keeps them). Small chunks so that prompts are chunked; the features the
# API kits and the sampling checks use; metrics for the EdgeAcc series.
SHARED_LAUNCH = ("--chunked-prefill-size", "128", "--enable-custom-logit-processor", "--grammar-backend", "xgrammar",
                 "--enable-return-hidden-states", "--enable-metrics")
SHARED_EDGE_ACC_LAUNCH = (*SHARED_LAUNCH, "--enable-edge-acc")

GPU_BACKEND_ARGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch")


def gpu_memory_by_pid() -> dict[int, int]:
    """MiB of GPU memory per process, from nvidia-smi (empty where it is missing). Under MPS each client is listed."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    usage = {}
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            usage[int(parts[0])] = int(parts[1])
    return usage


def gpu_server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SGLANG_PLATFORM", None)
    env.update(SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS="0", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


@dataclass
class SglangServer:
    args: tuple[str, ...]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_path: str = ""
    model_path: str = ""  # default: the shipped tiny model
    platform: str = "cpu"  # "cpu" (edgeacc_cpu) or "cuda"
    env: dict[str, str] = field(default_factory=dict)
    dummy_weights: bool = True
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    started_s: float = 0.0  # seconds from launch to healthy
    # Every process of the server seen so far, and the /dev/shm entries they used:
    # what the server leaves there is told apart from other processes' by these.
    seen_pids: set[int] = field(default_factory=set)
    seen_shm: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # An idle scheduler otherwise spins a core; CI has two. DP attention keeps
        # every rank stepping together, so it is left to spin there.
        idle = [] if "--dp" in self.args or self.platform != "cpu" else ["--sleep-on-idle"]
        backends = list(GPU_BACKEND_ARGS) if self.platform == "cuda" else []
        weights = ["--load-format", "dummy"] if self.dummy_weights else []
        return [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path or str(model_dir()), *weights,
            "--host", "127.0.0.1", "--port", str(self.port),
            *idle, *backends, *self.args,
        ]

    def launch(self, env: dict[str, str] | None = None) -> "SglangServer":
        """Start the process and return at once; :meth:`wait_healthy` waits for it."""
        log = tempfile.NamedTemporaryFile(prefix="edgeacc-server-", suffix=".log", delete=False,
                                          dir=os.environ.get(SERVER_LOG_DIR_ENV) or None)
        self.log_path = log.name
        merged = {**self.env, **(env or {})}
        environment = gpu_server_env(merged) if self.platform == "cuda" else cpu_server_env(merged)
        self._launched_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True,
        )
        return self

    def start(self, env: dict[str, str] | None = None) -> "SglangServer":
        return self.launch(env).wait_healthy()

    def wait_healthy(self) -> "SglangServer":
        deadline = self._launched_at + self.startup_timeout_s
        while time.monotonic() < deadline:
            self.observe()
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start:\n{self.log_tail()}")
            try:
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    self.started_s = time.monotonic() - self._launched_at
                    self.observe()
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"server not healthy after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return fh.read()[-chars:]
        except OSError:
            return "<no log>"

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def observe(self) -> None:
        """Note the server's processes and the /dev/shm entries they use now."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = {self.proc.pid, *(p.pid for p in self.descendants())}
        self.seen_pids |= pids
        self.seen_shm |= shm_in_use(pids)

    def shm_left(self) -> set[str]:
        """Entries in /dev/shm that the server's processes created or used and no live process uses."""
        candidates = {
            name for name in os.listdir(SHM_DIR)
            if name in self.seen_shm or shm_creator_pid(name) in self.seen_pids
        }
        return candidates - shm_in_use_by_anyone() if candidates else set()

    def remove_shm_left(self) -> set[str]:
        removed = set()
        for name in self.shm_left():
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.add(name)
            except FileNotFoundError:
                pass
        return removed

    def pause(self) -> None:
        """SIGSTOP every process of the server (its process group): a kept server costs no CPU."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 30.0, remove_shm: bool = True) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after ``timeout``.

        With ``remove_shm`` it then removes what the server left in /dev/shm (upstream
        sglang leaves files there on every stop, see docs/troubleshooting.md), so that a
        day of test runs does not fill the tmpfs.
        """
        if self.proc is None:
            return
        self.observe()
        tree = [psutil.Process(self.proc.pid)] + self.descendants() if self.proc.poll() is None else []
        self.resume()  # a paused server handles its SIGTERM only once continued
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _, alive = psutil.wait_procs(tree, timeout=timeout)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        if remove_shm:
            self.remove_shm_left()

    # --- requests -----------------------------------------------------------------
    def generate(self, text, max_new_tokens: int = 8, sampling: dict | None = None, **extra) -> dict | list:
        """Greedy generation; ``text`` is a prompt string, a list of token ids, or a batch of either (a list)."""
        params = {"max_new_tokens": max_new_tokens, "temperature": 0, **(sampling or {})}
        ids = isinstance(text, list) and text and isinstance(text[0], (int, list))
        prompt = {"input_ids": text} if ids else {"text": text}
        payload = {**prompt, "sampling_params": params, **extra}
        response = requests.post(f"{self.url}/generate", json=payload, timeout=120)
        response.raise_for_status()
        return response.json()

    def generate_stream(self, text, max_new_tokens: int = 8) -> list[dict]:
        prompt = {"input_ids": text} if isinstance(text, list) else {"text": text}
        payload = {**prompt, "stream": True, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
        chunks = []
        with requests.post(f"{self.url}/generate", json=payload, stream=True, timeout=120) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
                    chunks.append(json.loads(line[5:]))
        return chunks

    def chat(self, content: str, max_tokens: int = 8) -> dict:
        payload = {"model": "tiny", "messages": [{"role": "user", "content": content}],
                   "max_tokens": max_tokens, "temperature": 0}
        response = requests.post(f"{self.url}/v1/chat/completions", json=payload, timeout=120)
        response.raise_for_status()
        return response.json()

    def completion(self, prompt: str, max_tokens: int = 8) -> dict:
        payload = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        response = requests.post(f"{self.url}/v1/completions", json=payload, timeout=120)
        response.raise_for_status()
        return response.json()


# The CPU tests' name for it.
CpuServer = SglangServer


@contextlib.contextmanager
def started_together(servers: dict[str, SglangServer]):
    """Launch every server at once (one start leaves a core idle while a single process imports
    sglang), wait until all are healthy, and stop them all afterwards."""
    try:
        for server in servers.values():
            server.launch()
        for server in servers.values():
            server.wait_healthy()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def session_processes(session_id: int) -> list[psutil.Process]:
    """The live (not zombie) processes of a process session: a server launched here and all it started."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == session_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def assert_nothing_left(server: SglangServer, within_s: float = 5.0) -> None:
    """No live process of the server's session remains within ``within_s``.

    Python's resource tracker ends by itself once the last process using it is gone, so this waits.
    """
    deadline = time.monotonic() + within_s
    while session_processes(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = []
    for proc in session_processes(server.proc.pid):
        try:
            left.append((proc.pid, proc.name()))
        except psutil.Error:  # ended meanwhile
            pass
    assert not left, f"processes of the server left behind: {left}"


def random_checkpoint(directory, seed: int) -> str:
    """The shipped tiny model's config and tokenizer with random weights saved as safetensors."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.copytree(model_dir(), directory, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    return str(directory)
