"""A bench session: the arms' workers, started once, and one measurement at a time on any of them."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from strata.gguf.reader import GGUFFile
from strata.model_store import resolve_model

from . import machine, provenance
from .arms import ArmSpec
from .process import ArmProcess
from .runners import WorkerConfig
from .trees import HARNESS_ROOT, Trees
from .workload import Workload, make_prompts, plain_token_ids


@dataclass(frozen=True)
class BenchConfig:
    """Built by `strata bench` from its arguments; the same for every arm unless an arm overrides it."""

    model: Path
    workload: Workload
    threads: int
    out: Path
    device: str = "cpu"
    warmup: int = 1  # untimed-for-the-summary runs per arm before the measured ones
    settle_s: float = 0.5  # pause before each run, so the other worker's spinning threads go to sleep
    argv: tuple[str, ...] = field(default=())
    tensor_parallel: int = 1  # --tensor-parallel: strata arms' ranks, unless an arm sets its own

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device {self.device}: choose cpu or cuda")
        if self.threads < 1 or self.warmup < 0:
            raise ValueError(
                f"threads ({self.threads}) must be at least 1 and warmup ({self.warmup}) 0 or more"
            )


def default_out(kind: str) -> Path:
    return Path("bench-out") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{kind}"


def metric_names(workload: Workload) -> list[str]:
    return ["prefill_tok_s", "decode_tok_s"] if workload.mode == "decode" else ["prefill_tok_s"]


class Session:
    def __init__(self, config: BenchConfig, arms: dict[str, ArmSpec]) -> None:
        self.config, self.arms = config, arms
        types = GGUFFile(config.model).metadata.get("tokenizer.ggml.token_type", [])
        self.prompts = make_prompts(config.workload, plain_token_ids(types))
        self.runs: list[dict[str, Any]] = []
        self.trees = Trees()
        self.workers: dict[str, ArmProcess] = {}
        try:
            for name, spec in arms.items():
                tree = self.trees.tree_for(spec)
                worker = WorkerConfig(
                    kind=spec.kind,
                    model=str(self.model_of(spec)),
                    options=self.options_of(spec),
                    threads=int(spec.options.get("threads", config.threads)),
                    device=config.device,
                    max_context=config.workload.max_context,
                )
                log = config.out / "logs" / f"{name}.log"
                self.workers[name] = ArmProcess(name, spec, tree, self.trees.package_root, vars(worker), log)
            for worker_process in self.workers.values():  # the workers load in parallel
                worker_process.wait_ready()
        except BaseException:
            self.close()
            raise

    def options_of(self, spec: ArmSpec) -> dict[str, str]:
        """The arm's options for its worker; a strata arm gets --tensor-parallel unless it sets its own."""
        options = {k: v for k, v in spec.options.items() if k not in ("threads", "model")}
        if spec.kind == "strata" and self.config.tensor_parallel > 1:
            options.setdefault("tensor_parallel", str(self.config.tensor_parallel))
        return options

    def model_of(self, spec: ArmSpec) -> Path:
        """The arm's own `model=` (a packaged name or a path), else the session's model; absolute."""
        name = spec.options.get("model")
        return (resolve_model(name) if name is not None else self.config.model).resolve()

    def measure(self, arm: str, pair: int | None, warmup: bool = False) -> dict[str, Any]:
        """One run on `arm`; the record is appended to `self.runs` and written to runs.json."""
        time.sleep(self.config.settle_s)
        w = self.config.workload
        load_1m = os.getloadavg()[0]
        idle = [p for name, p in self.workers.items() if name != arm]
        idle0, busy0 = _cpu_of(idle), machine.machine_busy_s()
        reply, wall_s = self.workers[arm].run(w.to_json(), self.prompts)
        idle1, busy1 = _cpu_of(idle), machine.machine_busy_s()
        record: dict[str, Any] = {
            "arm": arm,
            "spec": str(self.arms[arm]),
            "index": len(self.runs),
            "pair": pair,
            "warmup": warmup,
            "prefill_tok_s": w.batch * w.prompt_len / reply["prefill_s"],
        }
        if w.mode == "decode":
            record["decode_tok_s"] = w.batch * w.new_tokens / reply["decode_s"]
        record["value"] = record[metric_names(w)[-1]]
        record |= {"prefill_s": reply["prefill_s"], "decode_s": reply["decode_s"], "wall_s": wall_s}
        # On a shared machine: the worker's CPU seconds (about threads x wall when it had the cores),
        # what the idle arms burnt meanwhile (spinning threads), and the rest of the machine's use.
        idle_s = idle1 - idle0 if idle0 is not None and idle1 is not None else None
        others = None
        if busy0 is not None and busy1 is not None and reply.get("cpu_s") is not None:
            others = busy1 - busy0 - reply["cpu_s"] - (idle_s or 0.0)
        record |= {"cpu_s": reply.get("cpu_s"), "idle_arms_cpu_s": idle_s, "other_cpu_s": others}
        record["load_1m"] = load_1m
        record["tokens"] = reply["tokens"]
        self.runs.append(record)
        write_json(self.config.out / "runs.json", self.runs)
        return record

    def metadata(self) -> dict[str, Any]:
        prompts = json.dumps(self.prompts).encode()
        arms = {}
        for name, worker in self.workers.items():
            sources = provenance.arm_sources(worker.tree)
            arms[name] = {"spec": str(worker.spec), "worker": worker.info} | sources
            if "model" in worker.spec.options:
                arms[name]["model"] = provenance.model_info(self.model_of(worker.spec))
        return {
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": list(self.config.argv),
            "harness": provenance.git_state(HARNESS_ROOT),
            "harness_bench_sources": provenance.source_hashes(HARNESS_ROOT, "strata/bench"),
            "arms": arms,
            "model": provenance.model_info(self.config.model),
            "workload": self.config.workload.to_json(),
            "threads": self.config.threads,
            "settle_s": self.config.settle_s,
            "prompts_sha256": hashlib.sha256(prompts).hexdigest(),
            "prompts": self.prompts,
            "device": provenance.device_info(),
            "versions": provenance.versions(),
        }

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.trees.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _cpu_of(workers: list[ArmProcess]) -> float | None:
    seconds = [machine.process_cpu_s(w.proc.pid) for w in workers]
    return None if None in seconds else sum(s for s in seconds if s is not None)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dumps(data) + "\n")


def _dumps(data: Any, indent: str = "") -> str:
    """Indented JSON whose lists of plain values (token ids, residuals) stay on one line."""
    inner = indent + " "
    if isinstance(data, dict) and data:
        items = (f"{inner}{json.dumps(str(k))}: {_dumps(v, inner)}" for k, v in data.items())
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(data, list) and any(isinstance(v, dict | list) for v in data):
        return "[\n" + ",\n".join(inner + _dumps(v, inner) for v in data) + f"\n{indent}]"
    return json.dumps(data)
