"""A follower rank: load this rank's part of the model, then run every step rank 0 announces.

    python -m strata.parallel.follower '<FollowerSpec as JSON>'

Started by `strata.parallel.launch` only. It ends on rank 0's Stop message, and also when rank 0's
process is gone (a watchdog thread sees the parent change), so no follower outlives its leader.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from strata.engine.kv_cache import KVCache
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.models import build_model
from strata.models.base import DecoderModel
from strata.parallel.group import CONTROL_TIMEOUT, TensorParallel, join, leave
from strata.parallel.launch import GO_KEY, STORE_TIMEOUT, FollowerSpec, error_key, ready_key
from strata.parallel.messages import Step, Stop, metadata_to

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _exit_with_parent() -> None:
    """Exit as soon as rank 0's process is gone, even while blocked inside a collective."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="strata-parent-watch", daemon=True).start()


def _load(spec: FollowerSpec) -> DecoderModel:
    gguf = GGUFFile(spec.model)
    tp = TensorParallel(spec.rank, spec.size)
    return build_model(gguf, ModelSpec.from_gguf(gguf), _DTYPES[spec.dtype], device=spec.torch_device, tp=tp)


@torch.inference_mode()
def follow(model: DecoderModel, control: dist.ProcessGroup) -> None:
    """Run rank 0's steps until Stop: each on the KV cache that mirrors rank 0's cache of the same key."""
    s, device = model.spec, model.device
    caches: dict[int, KVCache] = {}
    while True:
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=control)
        message = box[0]
        if isinstance(message, Stop):
            return
        assert isinstance(message, Step)
        for key in message.freed:
            caches.pop(key, None)
        kv = caches.get(message.cache)
        if kv is None:
            kv_heads = model.place.tp.local(s.num_kv_heads)
            kv = KVCache(s.num_layers, message.num_slots, kv_heads, s.head_dim, model.dtype, device)
            caches[message.cache] = kv
        model.step(message.ids.to(device), kv, metadata_to(message.meta, device), message.rows)


def main(argv: list[str]) -> int:
    _exit_with_parent()
    # Ctrl-C in a terminal reaches the whole process group: rank 0 handles it and sends Stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = FollowerSpec(**json.loads(argv[0]))
    if spec.threads:
        torch.set_num_threads(spec.threads)
    store = dist.TCPStore("127.0.0.1", spec.port, spec.size, is_master=False, timeout=STORE_TIMEOUT)
    try:
        model = _load(spec)
    except Exception as e:  # rank 0 raises it, with this message, from its start
        traceback.print_exc()
        store.set(error_key(spec.rank), f"{type(e).__name__}:{e}")
        return 1
    store.set(ready_key(spec.rank), "ok")
    store.wait([GO_KEY], CONTROL_TIMEOUT)
    control = join(TensorParallel(spec.rank, spec.size), store, spec.torch_device)
    try:
        follow(model, control)
    finally:
        leave()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
