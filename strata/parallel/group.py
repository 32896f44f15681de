"""The process group of a tensor-parallel model: who this rank is, how it joins the others, and the
collectives the layers call (torch.distributed: NCCL between GPUs, gloo between CPU processes)."""

from __future__ import annotations

import datetime
import os
from collections.abc import MutableMapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

# NVLink multicast (NVLS, NVLink SHARP) stays off in NCCL, PyTorch's symmetric memory and NVSHMEM: on
# the lent GPU hosts a program that uses it can take the host's shared GPUs out of service for a day or
# more (the device KINDS.md). Set before any init, and in every environment a worker starts with.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# Followers wait on the control group between steps, which for an idle server may be hours: its
# timeout only bounds a wait for rank 0, whose death the followers notice by other means (follower.py).
CONTROL_TIMEOUT = datetime.timedelta(days=365)
# The steps' own collectives finish in milliseconds; a rank stuck this long in one is a dead peer.
STEP_TIMEOUT = datetime.timedelta(minutes=10)


def multicast_off(environ: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Force NVLink multicast off in `environ` (default: this process's environment) and return it."""
    environ = os.environ if environ is None else environ
    environ.update(MULTICAST_OFF)
    return environ


@dataclass(frozen=True)
class TensorParallel:
    """This process's place among `size` ranks that each hold about 1/size of every layer (rank 0 leads)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} of {self.size} is out of range")

    def local(self, count: int) -> int:
        """This rank's share of `count` heads, which the start check found to split evenly. (The FFN splits
        in runs of whole blocks that may differ by one block: its widths come from the loaded layers.)"""
        return count // self.size


SINGLE = TensorParallel()  # one process holds the whole model


def join(tp: TensorParallel, store: dist.Store, device: torch.device) -> dist.ProcessGroup:
    """Join the default group (the steps' collectives: NCCL between GPUs, gloo between CPU processes)
    and return the control group, always gloo: rank 0's step messages are small host objects, and a
    follower waiting a long time for the next one must not trip NCCL's timeout watchdog."""
    multicast_off()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", store=store, rank=tp.rank, world_size=tp.size, timeout=STEP_TIMEOUT, device_id=device
        )
    else:
        dist.init_process_group("gloo", store=store, rank=tp.rank, world_size=tp.size, timeout=STEP_TIMEOUT)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    assert control is not None
    return control


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Sum `x` over the ranks, in place; one rank: `x` untouched."""
    if tp.size > 1:
        dist.all_reduce(x)
    return x


def all_gather_last(x: torch.Tensor, tp: TensorParallel, total: int) -> torch.Tensor:
    """The ranks' (..., n_r) slices side by side along the last dim, cut to `total` columns.

    Slices may be uneven (a vocabulary that does not divide): each is padded to the widest, which
    `dist.all_gather` needs, and the padding is cut off after."""
    if tp.size == 1:
        return x
    width = -(-total // tp.size)
    padded = torch.nn.functional.pad(x, (0, width - x.shape[-1])).contiguous()
    parts = [torch.empty_like(padded) for _ in range(tp.size)]
    dist.all_gather(parts, padded)
    return torch.cat(parts, dim=-1)[..., :total]
