"""`Leader`: rank 0's side of a tensor-parallel model. Before each step it broadcasts what the other
ranks need to run the same step; it also owns their processes and ends them, whatever happens."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import subprocess
import weakref

import torch
import torch.distributed as dist

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.parallel.group import leave
from strata.parallel.messages import Message, Step, Stop, metadata_to

# How long close() waits for a follower to exit on its own after Stop before killing it.
_EXIT_WAIT_S = 10.0


def end_processes(procs: list[subprocess.Popen[bytes]], wait_s: float = 0.0) -> None:
    """Give each process `wait_s` seconds to exit on its own, then kill it; reap them all."""
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
        if proc.poll() is None:
            proc.kill()
        proc.wait()


class FollowerDied(RuntimeError):
    """A follower process has exited; the model cannot step any more (restart it)."""


class Leader:
    """Rank 0's handle on the followers: `announce` each step, `close` at the end (also at exit).

    Steps are plain pickled messages on a gloo control group. On a GPU that is a host copy of the
    step's ids and metadata per step, which rank 0 built on the host anyway; cheap next to a forward
    of a model large enough to need several GPUs, and the first thing to replace (by building the
    tensors on every rank from the same host lists) if a profile says otherwise.
    """

    def __init__(self, followers: list[subprocess.Popen[bytes]], control: dist.ProcessGroup) -> None:
        self.followers, self.control = followers, control
        self._keys: weakref.WeakKeyDictionary[KVCache, int] = weakref.WeakKeyDictionary()
        self._freed: list[int] = []  # keys of caches collected since the last step
        self._counter = itertools.count()
        self._open = True
        atexit.register(self.close)  # an exit without close() still ends the followers cleanly

    def announce(
        self, ids: torch.Tensor, kv: KVCache, meta: AttentionMetadata, rows: list[int] | slice
    ) -> None:
        """Tell every follower to run this step (the caller runs it next, on rank 0)."""
        if not self._open:
            raise FollowerDied("the tensor-parallel ranks were stopped (after a failed step or close())")
        self._check_alive()
        freed = []
        while self._freed:  # pop, not copy-and-clear: a finalizer may append from another thread
            freed.append(self._freed.pop())
        step = Step(self._key(kv), kv.num_slots, ids.cpu(), metadata_to(meta, "cpu"), rows, tuple(freed))
        self._send(step)

    def _key(self, kv: KVCache) -> int:
        key = self._keys.get(kv)
        if key is None:
            key = self._keys[kv] = next(self._counter)
            weakref.finalize(kv, self._freed.append, key)
        return key

    def _send(self, message: Message) -> None:
        dist.broadcast_object_list([message], src=0, group=self.control)

    def _check_alive(self) -> None:
        for rank, proc in enumerate(self.followers, start=1):
            code = proc.poll()
            if code is not None:
                self.abort()
                raise FollowerDied(
                    f"tensor-parallel rank {rank} exited with code {code} (its error, if any, is above); "
                    "restart strata"
                )

    def close(self) -> None:
        """Stop the followers (a Stop message; a kill for any that has not exited soon after) and
        leave the group."""
        if not self._open:
            return
        stopped = False
        if all(proc.poll() is None for proc in self.followers):
            try:
                self._send(Stop())
                stopped = True
            except Exception:  # a broken group: the kill in _end still ends every follower
                pass
        self._end(_EXIT_WAIT_S if stopped else 0.0)

    def abort(self) -> None:
        """End the followers now: after a failed step the ranks disagree on where they are."""
        if self._open:
            self._end(0.0)

    def _end(self, wait_s: float) -> None:
        self._open = False
        atexit.unregister(self.close)
        end_processes(self.followers, wait_s)
        leave()
