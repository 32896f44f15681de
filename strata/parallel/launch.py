"""Starting a tensor-parallel model: N-1 follower processes, rank 0 in the calling process.

Rank 0 hosts a TCP store on a free loopback port and starts the followers, which load their parts
while rank 0 loads its own; each follower then marks itself ready in the store (or leaves its error
there) and waits for rank 0's go, and then every rank joins the process group. Until all are ready
rank 0 polls, so a follower that fails or dies while loading is reported at once instead of hanging
the start, and however long any rank takes to load, no group timeout runs meanwhile.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

import strata
from strata import env
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.models import build_model
from strata.models.base import DecoderModel
from strata.parallel.group import TensorParallel, join, multicast_off
from strata.parallel.leader import FollowerDied, Leader, end_processes
from strata.parallel.plan import check_shardable

if TYPE_CHECKING:
    from strata.engine.llm import ModelConfig

STORE_TIMEOUT = datetime.timedelta(minutes=5)  # a follower's wait to reach rank 0's store
_POLL_S = 0.05


@dataclass(frozen=True)
class FollowerSpec:
    """What a follower loads and where it meets rank 0: JSON on its command line."""

    model: str
    dtype: str
    device: str  # "cpu" or "cuda"; rank r of a CUDA model uses GPU r
    rank: int
    size: int
    port: int
    threads: int | None  # CPU threads (None: torch's choice)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.rank) if self.device == "cuda" else torch.device("cpu")


def ready_key(rank: int) -> str:
    return f"strata/ready/{rank}"


def error_key(rank: int) -> str:
    return f"strata/error/{rank}"


GO_KEY = "strata/go"  # set by rank 0 once it has loaded too: the ranks join the group


def cpu_threads(size: int) -> int:
    """Threads per rank on the CPU: STRATA_NUM_THREADS, else the cores shared out, so N processes
    spinning torch's threads do not oversubscribe the machine."""
    return env.num_threads() or max(1, (os.cpu_count() or 1) // size)


class Launch:
    """The followers, started; `join()` waits for them and returns rank 0's `Leader`."""

    def __init__(self, model: Path, dtype: str, device: str, size: int) -> None:
        multicast_off()
        self.size, self.device = size, device
        self.store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        threads = cpu_threads(size) if device == "cpu" else None
        self.threads = threads
        environ = multicast_off(dict(os.environ))
        # The followers import this very strata (a bench arm may run another commit's tree).
        root = str(Path(strata.__file__).resolve().parent.parent)
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, (root, environ.get("PYTHONPATH"))))
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(1, size):
                spec = FollowerSpec(str(model), dtype, device, rank, size, self.store.port, threads)
                cmd = [sys.executable, "-m", "strata.parallel.follower", json.dumps(asdict(spec))]
                # stdout stays free for the caller's own output (a CLI's text, a bench protocol).
                self.procs.append(subprocess.Popen(cmd, env=environ, stdin=subprocess.DEVNULL, stdout=2))
        except BaseException:
            self.kill()
            raise

    def join(self, device: torch.device) -> Leader:
        """Wait until every follower has loaded, then join the group; kills them all on failure."""
        try:
            self._wait_ready()
            self.store.set(GO_KEY, "go")
            control = join(TensorParallel(0, self.size), self.store, device)
        except BaseException:
            self.kill()
            raise
        return Leader(self.procs, control)

    def _wait_ready(self) -> None:
        keys = [ready_key(rank) for rank in range(1, self.size)]
        while not self.store.check(keys):
            for rank, proc in enumerate(self.procs, start=1):
                if self.store.check([error_key(rank)]):
                    kind, _, message = self.store.get(error_key(rank)).decode().partition(":")
                    raise (ValueError if kind == "ValueError" else FollowerDied)(
                        f"tensor-parallel rank {rank} failed to load: {message}"
                    )
                code = proc.poll()
                if code is not None:
                    raise FollowerDied(f"tensor-parallel rank {rank} exited with code {code} while loading")
            time.sleep(_POLL_S)

    def kill(self) -> None:
        end_processes(self.procs)


def start_tensor_parallel(
    gguf: GGUFFile, spec: ModelSpec, config: ModelConfig, dtype: torch.dtype, progress: bool = False
) -> tuple[DecoderModel, Leader]:
    """Rank 0's part of the model, with the followers loaded and joined: what `LLM` runs."""
    size = config.tensor_parallel
    check_shardable(gguf, spec, size)  # before any process starts
    if dist.is_initialized():  # torch.distributed has one default group per process
        raise ValueError("a tensor-parallel model is already loaded in this process; close() it first")
    device = torch.device("cuda", 0) if config.device == "cuda" else torch.device("cpu")
    launch = Launch(config.path, config.dtype, config.device, size)
    try:
        if launch.threads:
            torch.set_num_threads(launch.threads)
        model = build_model(gguf, spec, dtype, progress, device, TensorParallel(0, size))
        leader = launch.join(device)
    except BaseException:
        launch.kill()
        raise
    model.leader = leader
    return model, leader
