"""`QuantLinear`: a linear layer whose weight comes from a GGUF tensor of any quant type."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from gguf.constants import GGMLQuantizationType
from torch import nn

from strata import env
from strata.gguf.reader import GGUFFile
from strata.layers.activation import gated
from strata.layers.placement import Placement
from strata.parallel.group import all_reduce
from strata.parallel.shard import part_of, shard_bias, shard_matrix, split_of
from strata.quant import dequantize

# strata.kernels needs triton, which a CPU-only install may lack: it is imported only on the kernel path.
if TYPE_CHECKING:
    from strata.kernels.kv_in_matvec import KVWrite
    from strata.kernels.quant_pack import PackedQuantWeight


# Output rows from which a weight counts as wide (7B: gate+up, the output head; not q, k, v, o, down).
WIDE_ROWS = 16384
# STRATA_DENSE_COPY=auto keeps a weight's dense copy while this share of the GPU's memory stays free
# after it: room for the KV cache, the CUDA graphs and the activations. An 80 GB GPU keeps all of a
# 7B's (about 14 GB); a 16 GB one keeps them until the weights and copies reach 8 GB.
DENSE_COPY_FREE_SHARE = 0.5
# Types the fused matmul decodes in a few operations a weight, near the bytes' speed: a wide weight of
# these keeps no dense copy under STRATA_DENSE_WIDE=auto (the 0.5B's Q8_0 output head at 64 sequences
# 0.974x with one, H100; the K-quant heads and gate+up gained: `strata.env.dense_wide`).
CHEAP_DECODE = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q8_0})


def may_copy(out_features: int, qtype: GGMLQuantizationType) -> bool:
    """Whether a weight of this many outputs and this type may keep a dense copy: a narrow one always
    (STRATA_DENSE_COPY decides); a wide one as STRATA_DENSE_WIDE says, under `auto` one of a type whose
    fused matmul is bound by decoding it (the K-quants, the IQ types)."""
    if out_features < WIDE_ROWS:
        return True
    setting = env.dense_wide()
    return setting == "1" or (setting == "auto" and qtype not in CHEAP_DECODE)


def dense_copy_bytes(model: nn.Module) -> int:
    """Bytes of the dense copies (STRATA_DENSE_COPY) that the model's layers keep, each storage once
    (a STRATA_DENSE_STACK copy is its parts')."""
    storages = {}
    for layer in model.modules():
        if isinstance(layer, QuantLinear) and layer.dense is not None:
            storage = layer.dense.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def dense_copy_fits(nbytes: int, free: int, total: int) -> bool:
    """Whether a dense copy of `nbytes` leaves DENSE_COPY_FREE_SHARE of a GPU's `total` bytes free."""
    return free - nbytes >= DENSE_COPY_FREE_SHARE * total


class QuantLinear(nn.Module):
    """y = x W^T + b, W read from GGUF bytes.

    On the reference path W is dequantized once, at build time, into the compute dtype, and every
    call is a dense matmul. On the kernel path W stays in its GGUF blocks on the device (regrouped
    into aligned planes, the same bytes): up to `matvec_rows` rows go through the fused dequant
    matvec, more through the fused dequant matmul, and from `dense_rows` rows on the weight is
    dequantized on the fly for cuBLAS (both from `strata.env.kernel_row_limits`: 4 and 64 by default;
    a wide weight, `WIDE_ROWS` outputs or more, without a copy keeps the matmul at 64 rows too). A
    weight with a dense copy (STRATA_DENSE_COPY; STRATA_DENSE_WIDE for the wide ones), dequantized at
    build time, gives batches of `copy_rows` rows or more (`strata.env.copy_rows`: 5) to cuBLAS on
    that copy instead.
    Types without a fused kernel keep a dense weight.

    Under tensor parallelism a layer holds its rank's part of the weight (`strata.parallel.shard`); a
    row-parallel one (`all_reduce`) sums the ranks' partial outputs before returning. A row-parallel
    part whose columns do not fall on block boundaries is stored as the whole blocks around them; `pad`
    widens the input to those with zeros, so the neighbours' columns in the blocks add exact zeros.
    """

    def __init__(
        self,
        qweight: torch.Tensor | PackedQuantWeight,
        qtype: GGMLQuantizationType,
        shape: tuple[int, int],
        place: Placement,
        bias: torch.Tensor | None = None,
        all_reduce: bool = False,
        pad: tuple[int, int] | None = None,
        dense: torch.Tensor | None = None,
    ) -> None:
        """`qweight`: the stored GGUF bytes, or a weight already packed for the kernels. `pad`: the zero
        columns (left, right) added around each input; `shape` counts them. `dense`: the STRATA_DENSE_COPY
        copy of a packed weight when the caller has it already (made here otherwise)."""
        super().__init__()
        self.qtype, self.tp, self.all_reduce, self.pad = qtype, place.tp, all_reduce, pad
        self.kernels = place.kernels
        self.out_features, self.in_features = shape
        self.packed: PackedQuantWeight | None = None
        self.weight: nn.Parameter | None = None
        if not isinstance(qweight, torch.Tensor):
            self.packed = qweight
        elif place.kernels and _has_kernel(qtype):
            from strata.kernels.quant_pack import pack_quant_weight

            self.packed = pack_quant_weight(qweight.to(place.device), qtype, *shape)
        else:
            dense = dequantize(qweight.to(place.device), qtype, shape).to(place.dtype)
            self.weight = nn.Parameter(dense, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(place.device, place.dtype), False)
        # Read once per layer, not per call (the measured crossovers: strata.env.kernel_row_limits).
        self.matvec_rows, self.dense_rows = env.kernel_row_limits()
        self.copy_rows = env.copy_rows(self.matvec_rows)
        self.act_in_quant = env.act_in_quant()
        # STRATA_DENSE_COPY: the weight dequantized once, for batches of copy_rows rows or more.
        self.dense = dense
        if (
            dense is None
            and self.packed is not None
            and may_copy(self.out_features, qtype)
            and self._copies(place)
        ):
            from strata.kernels.dequant_packed import dequantize_packed

            self.dense = dequantize_packed(self.packed, place.dtype)
        if self.out_features >= WIDE_ROWS and self.dense is None:
            # A wide weight takes the fused matmul at DENSE_ROWS rows too (H200, 7B, 64 rows: gate+up
            # 1.67x, the output head 1.32x faster than dequantize + cuBLAS; 128 rows 0.93x, 0.85x).
            self.dense_rows += 1

    def _copies(self, place: Placement) -> bool:
        """Whether this weight keeps a dense copy (STRATA_DENSE_COPY): `auto` on a GPU with room for it."""
        setting = env.dense_copy()
        if setting != "auto":
            return setting == "1"
        if place.device.type != "cuda":
            return False
        free, total = torch.cuda.mem_get_info(place.device)
        nbytes = self.out_features * self.in_features * place.dtype.itemsize
        return dense_copy_fits(nbytes, free, total)

    @classmethod
    def load(cls, gguf: GGUFFile, name: str, place: Placement) -> QuantLinear:
        """The layer `name` of the file: `name.weight` and, when the file has one, `name.bias`; under
        tensor parallelism, this rank's part of them."""
        info = gguf.tensor_info(f"{name}.weight")
        bias = None
        if f"{name}.bias" in gguf.tensors:
            b = gguf.tensor_info(f"{name}.bias")
            bias = dequantize(gguf.tensor_bytes(b.name), b.qtype, b.shape)
        out_features, in_features = info.shape
        raw, shape = gguf.tensor_bytes(info.name), (out_features, in_features)
        split = split_of(name) if place.tp.size > 1 else None
        if split is None:
            return cls(raw, info.qtype, shape, place, bias)
        part = part_of(gguf.tensors, name, place.tp)
        raw, shape = shard_matrix(raw, info.qtype, shape, split, part)
        bias = shard_bias(bias, split, part, place.tp)
        return cls(raw, info.qtype, shape, place, bias, all_reduce=split == "in", pad=part.pad)

    def forward(
        self,
        x: torch.Tensor,
        up: torch.Tensor | None = None,
        act: str = "silu",
        *,
        kv: KVWrite | None = None,
    ) -> torch.Tensor:
        """x W^T + b; with `up`, of the gated activation act(x) * up (`act` "silu" or "gelu_tanh"), which
        the matvec computes inside x's int8 quantization where it can (`strata.env.act_in_quant`).
        With `kv` (where `writes_kv`), the output's rows are a decode step's q, k, v, rotated and
        written to the cache in the matvec's store (`kv_in_matvec`)."""
        rows = _rows(x)
        if up is not None and not (
            self.act_in_quant and self.packed is not None and self.pad is None and rows <= self.matvec_rows
        ):
            x, up = gated(act, x, up, self.kernels), None
        if self.pad is not None:
            x = F.pad(x, self.pad)  # (..., in_features): this rank's columns in its window, zeros around
        if not self.all_reduce:
            return self._partial(x, up, act, kv)
        if kv is not None:
            raise ValueError("a row-parallel projection cannot write K/V in its matvec (see writes_kv)")
        return all_reduce(self._partial(x, up, act), self.tp)

    def int8_orders(self) -> tuple[bool, ...]:
        """The order in which this matvec quantizes 16-bit x (`int8_inputs.int8_order`), if it does: ()
        off the kernel path, for a padded weight or a type on 16-bit x."""
        if self.packed is None or self.pad is not None:
            return ()
        from strata.kernels.int8_inputs import int8_order

        order = int8_order(self.packed)
        return () if order is None else (order,)

    def writes_kv(self, x: torch.Tensor, rotates: bool, head_dim: int) -> bool:
        """Whether `forward(x, kv=...)` writes K/V in the matvec's store (`quant_matvec.writes_kv`): rows
        of x few enough for the matvec, the weight neither padded nor row-parallel; `rotates`: rows of
        q or k, in heads of `head_dim`."""
        rows = _rows(x)
        if self.packed is None or self.pad is not None or self.all_reduce or rows > self.matvec_rows:
            return False
        from strata.kernels.quant_matvec import writes_kv

        return writes_kv(self.packed, x.dtype, rotates, head_dim)

    def _partial(
        self,
        x: torch.Tensor,
        up: torch.Tensor | None = None,
        act: str = "silu",
        kv: KVWrite | None = None,
    ) -> torch.Tensor:
        """x W^T + b with this rank's W (all of it on one rank); `up` and `kv` only on the matvec's rows
        (kv where `writes_kv`)."""
        if self.packed is None:
            assert self.weight is not None
            return F.linear(x, self.weight, self.bias)
        from strata.kernels.int8_inputs import attached_int8
        from strata.kernels.quant_matvec import quant_matvec

        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] <= self.matvec_rows:
            n, k = self.out_features, self.in_features
            gate_up = None if up is None else up.reshape(-1, self.in_features)
            pre = attached_int8(x)  # x quantized by the norm that made it (`RMSNorm.quantize_for`)
            y = quant_matvec(
                flat, self.packed, self.qtype, n, k, bias=self.bias, up=gate_up, act=act, x_int8=pre, kv=kv
            )
            return y.view(*x.shape[:-1], self.out_features)
        if kv is not None:
            raise ValueError(
                f"a K/V write needs the matvec's rows (at most {self.matvec_rows}), got {flat.shape[0]}"
            )
        copy = self.dense if self.dense is not None and self.dense.dtype == flat.dtype else None
        if copy is not None and flat.shape[0] >= self.copy_rows:
            y = F.linear(flat, copy, self.bias)
        elif flat.shape[0] < self.dense_rows or copy is not None:
            from strata.kernels.quant_matmul import quant_matmul

            y = quant_matmul(flat, self.packed)
            if self.bias is not None:
                y = y + self.bias
        else:
            from strata.kernels.dequant_packed import dequantize_packed

            y = F.linear(flat, dequantize_packed(self.packed, flat.dtype), self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        path = "fused kernels" if self.packed is not None else "dense"
        bias = self.bias is not None
        reduce = ", all-reduce" if self.all_reduce else ""
        pad = f", zero-padded input {self.pad}" if self.pad is not None else ""
        return (
            f"{self.in_features} -> {self.out_features}, {self.qtype.name}, {path}, bias={bias}{reduce}{pad}"
        )


def _rows(x: torch.Tensor) -> int:
    """The rows of x as its matvec sees them: every dimension but the last (0 for an empty last one)."""
    return x.numel() // max(1, x.shape[-1])


def stack_rows(layers: Sequence[QuantLinear], place: Placement) -> QuantLinear:
    """One packed layer whose output is the layers' outputs side by side: their planes stacked by rows
    (the same bytes), biases concatenated (zeros for a layer without one). All must be packed, unpadded,
    of one quant type and input size."""
    first = layers[0]
    if not all(_stackable(first, x) for x in layers):
        raise ValueError("stack_rows needs packed, unpadded layers of one quant type and input size")
    from strata.kernels.quant_pack import stack_packed

    n = sum(x.out_features for x in layers)
    packed = stack_packed([x.packed for x in layers if x.packed is not None])
    bias = _cat_biases(layers, place)
    # The parts' dense copies stacked like their planes (the same values), not dequantized again.
    dense = None
    if may_copy(n, first.qtype) and all(x.dense is not None for x in layers):
        dense = torch.cat([x.dense for x in layers if x.dense is not None])
    return QuantLinear(packed, first.qtype, (n, first.in_features), place, bias, dense=dense)


class Projections(nn.Module):
    """Several projections of one input (q, k, v; gate, up), returned in order.

    On the kernel path each run of neighbours that share a quant type becomes one layer over their
    stacked rows, so one matvec launch reads them all (and a wider one keeps more SMs busy); the
    outputs are column views of its result. Parts are named by the GGUF names they hold, joined by +.
    With STRATA_CONCURRENT_PROJECTIONS (on by default) the matvecs of parts on a GPU run side by side
    on streams of their own (`_side_by_side`). With STRATA_DENSE_STACK (on by default), parts that all
    keep dense copies share one copy of their rows side by side (`_stack_copies`), which batched steps
    multiply in one matmul.
    """

    def __init__(self, layers: dict[str, QuantLinear], place: Placement) -> None:
        super().__init__()
        if place.kernels and env.widen_to_stack():
            layers = _widened(layers, place)
        runs: list[list[str]] = []
        for name, layer in layers.items():
            prev = layers[runs[-1][-1]] if runs else None
            if place.kernels and prev is not None and _stackable(prev, layer):
                runs[-1].append(name)
            else:
                runs.append([name])
        parts = {}
        for run in runs:
            group = [layers[n] for n in run]
            parts["+".join(run)] = group[0] if len(group) == 1 else stack_rows(group, place)
        self.parts = nn.ModuleDict(parts)
        self.sizes = [[layers[n].out_features for n in r] for r in runs]
        self.stacked: tuple[torch.Tensor, torch.Tensor | None, int] | None = None
        if len(parts) > 1 and env.dense_stack():
            self.stacked = _stack_copies(list(parts.values()), place)
        self.concurrent = place.kernels and len(runs) > 1 and env.concurrent_projections()
        self.matvec_rows = env.kernel_row_limits()[0]

    def int8_orders(self) -> tuple[bool, ...]:
        """The orders in which the parts' matvecs quantize 16-bit x (`int8_inputs.int8_order`)."""
        parts = [p for p in self.parts.values() if isinstance(p, QuantLinear)]
        return tuple(sorted({order for p in parts for order in p.int8_orders()}))

    @classmethod
    def load(cls, gguf: GGUFFile, prefix: str, names: Sequence[str], place: Placement) -> Projections:
        """The layers `prefix.name` of the file, for each name in order."""
        return cls({n: QuantLinear.load(gguf, f"{prefix}.{n}", place) for n in names}, place)

    def writes_kv(self, x: torch.Tensor, q_rows: int, k_rows: int, head_dim: int) -> bool:
        """Whether every part's matvec takes a K/V write (`QuantLinear.writes_kv`) for x, the outputs'
        first `q_rows` rows being q's, the next `k_rows` k's, in heads of `head_dim`."""
        rows = _rows(x)
        if self.stacked is not None and rows >= self.stacked[2]:
            return False
        start = 0
        for part in self.parts.values():
            if not (isinstance(part, QuantLinear) and part.writes_kv(x, start < q_rows + k_rows, head_dim)):
                return False
            start += part.out_features
        return True

    def forward(self, x: torch.Tensor, kv: KVWrite | None = None) -> list[torch.Tensor]:
        """Each projection of x. With `kv` (where `writes_kv`), the outputs are q, k, v, written to the
        cache by the parts' matvecs (`kv.q_rows` and `kv.k_rows` for all of them)."""
        parts = list(self.parts.values())
        kvs = [None] * len(parts) if kv is None else kv.parts([sum(sizes) for sizes in self.sizes])
        rows = _rows(x)
        if self.stacked is not None and rows >= self.stacked[2] and x.dtype == self.stacked[0].dtype:
            assert kv is None  # see `writes_kv`
            y = F.linear(x, self.stacked[0], self.stacked[1])
            return list(y.split([n for sizes in self.sizes for n in sizes], dim=-1))
        if self.concurrent and x.is_cuda and rows <= self.matvec_rows:
            ys = _side_by_side(x, parts, kvs)
        else:
            ys = [_run(part, x, part_kv) for part, part_kv in zip(parts, kvs, strict=True)]
        outs: list[torch.Tensor] = []
        for y, sizes in zip(ys, self.sizes, strict=True):
            outs.extend(y.split(sizes, dim=-1) if len(sizes) > 1 else (y,))
        return outs


_SIDE_STREAMS: dict[torch.device, list[torch.cuda.Stream]] = {}


def _side_by_side(
    x: torch.Tensor, parts: Sequence[nn.Module], kvs: Sequence[KVWrite | None]
) -> list[torch.Tensor]:
    """Each part of x on a stream of its own, the first on the current one, which then waits for the
    others (under graph capture: parallel branches joined again). Every side stream first waits for
    the current one, so it reads x after x is written, and whatever a side stream allocates is used
    and freed before any later side-stream work reuses it. Split-K counters are per stream
    (`kernels.split_locks`)."""
    main = torch.cuda.current_stream(x.device)
    sides = _SIDE_STREAMS.setdefault(x.device, [])
    while len(sides) < len(parts) - 1:
        sides.append(torch.cuda.Stream(x.device))
    ys: list[torch.Tensor] = [x] * len(parts)
    for i, (part, side) in enumerate(zip(parts[1:], sides, strict=False), start=1):
        side.wait_stream(main)
        with torch.cuda.stream(side):
            ys[i] = _run(part, x, kvs[i])
    ys[0] = _run(parts[0], x, kvs[0])
    for side in sides[: len(parts) - 1]:
        main.wait_stream(side)
    return ys


def _stack_copies(
    parts: Sequence[nn.Module], place: Placement
) -> tuple[torch.Tensor, torch.Tensor | None, int] | None:
    """(copy, bias, rows) for STRATA_DENSE_STACK: the parts' dense copies side by side, their biases
    concatenated (zeros for a part without one, None if none has one), and the rows from which every
    part reads its copy; each part's copy becomes a view of its rows. None unless every part is a
    whole (unsharded, unpadded) layer with a dense copy of one dtype."""
    layers = [p for p in parts if isinstance(p, QuantLinear)]
    if len(layers) != len(parts) or not all(
        x.dense is not None and x.pad is None and not x.all_reduce and x.dense.dtype == place.dtype
        for x in layers
    ):
        return None
    copy = torch.cat([x.dense for x in layers if x.dense is not None])
    start = 0
    for x in layers:
        x.dense = copy[start : start + x.out_features]
        start += x.out_features
    bias = _cat_biases(layers, place)
    return copy, None if bias is None else bias.to(place.dtype), max(x.copy_rows for x in layers)


def _cat_biases(layers: Sequence[QuantLinear], place: Placement) -> torch.Tensor | None:
    """The layers' biases side by side (zeros for a layer without one); None if none has one."""
    if all(x.bias is None for x in layers):
        return None
    zeros = [torch.zeros(x.out_features, device=place.device) for x in layers]
    return torch.cat([z if x.bias is None else x.bias.data for x, z in zip(layers, zeros, strict=True)])


def _run(part: nn.Module, x: torch.Tensor, kv: KVWrite | None = None) -> torch.Tensor:
    """The part's output for x, with its K/V write where given (`QuantLinear.forward`)."""
    return part(x) if kv is None else part(x, kv=kv)


def _widened(layers: dict[str, QuantLinear], place: Placement) -> dict[str, QuantLinear]:
    """The layers with each Q5_0 one rewritten as Q8_0 (`quant_pack.widen_q5_0`, the same values) where
    they are all packed and unpadded, of one input size, and of these two types only, so that they
    stack into one launch (STRATA_WIDEN_TO_STACK); else the layers as they are."""
    parts = list(layers.values())
    if {x.qtype for x in parts} != {GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q8_0} or not all(
        x.packed is not None and x.pad is None and x.in_features == parts[0].in_features for x in parts
    ):
        return layers
    from strata.kernels.quant_pack import widen_q5_0

    out = {}
    for name, x in layers.items():
        if x.qtype == GGMLQuantizationType.Q5_0 and x.packed is not None:
            bias = None if x.bias is None else x.bias.data
            shape = (x.out_features, x.in_features)
            x = QuantLinear(
                widen_q5_0(x.packed), GGMLQuantizationType.Q8_0, shape, place, bias, dense=x.dense
            )
        out[name] = x
    return out


def _stackable(a: QuantLinear, b: QuantLinear) -> bool:
    return (
        a.packed is not None
        and b.packed is not None
        and a.pad is None
        and b.pad is None
        and a.qtype == b.qtype
        and a.in_features == b.in_features
        and a.packed.layout == b.packed.layout  # under STRATA_Q4K_LAYOUT=auto, by each part's size
    )


def _has_kernel(qtype: GGMLQuantizationType) -> bool:
    from strata.kernels.quant_matvec import MATVEC_TYPES

    return qtype in MATVEC_TYPES
