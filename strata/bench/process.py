"""`ArmProcess`: the harness's handle on one worker (see `worker`): start it, ask for runs, stop it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from .arms import ArmSpec
from .trees import WORKER_PACKAGE, ArmTree

# What torch's CUDA initialization adds to os.environ (CUDA_MODULE_LOADING=LAZY): workers get these only
# if the harness was started with them, so a worker's environment does not depend on whether the
# harness touched CUDA first. (Suspected in the llama.cpp worker's crash on the H200; diag.py then
# showed that variable harmless on its own, and the crash is still unexplained.)
_SET_BY_TORCH = ("CUDA_MODULE_LOADING",)
_START_ENV = {k: os.environ[k] for k in _SET_BY_TORCH if k in os.environ}


class WorkerFailed(RuntimeError):
    """A worker could not load its model or failed a run; the message carries its error."""


class ArmProcess:
    def __init__(
        self, name: str, spec: ArmSpec, tree: ArmTree, package_root: Path, config: dict[str, Any], log: Path
    ) -> None:
        self.name, self.spec, self.tree, self.log = name, spec, tree, log
        env = {k: v for k, v in os.environ.items() if k not in _SET_BY_TORCH} | _START_ENV
        # The arm's tree first: its `strata` shadows the editable install (a meta-path finder, tried last).
        # The caller's own PYTHONPATH stays after them (packages installed with --target live there).
        inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(tree.root), str(package_root), *inherited])
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file: IO[str] = open(log, "w")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"{WORKER_PACKAGE}.worker", json.dumps(config)],
            cwd=package_root,  # not the repository: `-m` puts the cwd first on sys.path
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            bufsize=1,
        )
        self.info: dict[str, Any] = {}

    def wait_ready(self) -> dict[str, Any]:
        self.info = self._receive("loading the model")
        expected = self.tree.root / "strata"
        loaded = self.info.get("strata_file")
        if loaded is not None and Path(loaded).resolve().parent != expected.resolve():
            raise WorkerFailed(f"arm {self.name} ({self.spec}) imported strata from {loaded}, not {expected}")
        return self.info

    def run(self, workload: dict[str, Any], prompts: list[list[int]]) -> tuple[dict[str, Any], float]:
        """One measurement; also returns the harness-side wall time of the request."""
        assert self.proc.stdin is not None
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps({"op": "run", "workload": workload, "prompts": prompts}) + "\n")
        self.proc.stdin.flush()
        reply = self._receive("a run")
        return reply, time.perf_counter() - t0

    def _receive(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            try:
                code: int | None = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            raise WorkerFailed(
                f"arm {self.name} ({self.spec}) exited during {what} (exit status {code}; "
                f"a negative status is the signal that ended it):\n{self._log_tail()}"
            )
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            detail = reply.get("traceback", "")
            raise WorkerFailed(f"arm {self.name} ({self.spec}) failed {what}: {reply['error']}\n{detail}")
        return reply

    def _log_tail(self, lines: int = 30) -> str:
        self._log_file.flush()
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:]) or f"(nothing in {self.log})"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
