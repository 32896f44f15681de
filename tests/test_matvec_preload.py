"""MatvecConfig.preload: the Q8_0 and Q5_0 fp32-x kernels load and decode a program's one K step of
weights before `await_inputs`, and Q4_K's int8 kernel its first step's. The same operations in the
same order as the plain loop, so the outputs must be equal bit for bit (plain and with bias), and
the configs the kernels do not implement are refused by name."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels import int8_matvec as im  # noqa: E402
from strata.kernels import quant_matvec as qm  # noqa: E402
from strata.kernels.matvec_tiles import preload_tile  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from tests.fp32_x import fp32_x_q8_0_and_q5_0  # noqa: E402, F401 - autouse: Q8_0, Q5_0 on 16-bit x
from tests.launch_recorder import LaunchRecorder  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, check, random_weight  # noqa: E402

TYPES = pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0], ids=lambda t: t.name)
# (n, k, tile): rows no multiple of block_n; one step covering K exactly, a ragged one, and a split
# K whose splits each fit a step (40 blocks in 3 splits of 14, 16 a step).
SHAPES = [
    (21, 8 * 32, MatvecConfig(8, 256, 1)),
    (37, 7 * 32, MatvecConfig(8, 256, 1, num_warps=2)),
    (19, 40 * 32, MatvecConfig(8, 512, 3)),
]


def weight(qtype: T, n: int, k: int):
    raw = random_weight(qtype, n, k, seed=n * 31 + k)
    return pack_quant_weight(raw.to(DEVICE), qtype, n, k)


@TYPES
@pytest.mark.parametrize("n,k,cfg", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("matched", [False, True], ids=["plain", "matched"])
def test_preload_is_bitwise_the_plain_step(
    qtype: T, n: int, k: int, cfg: MatvecConfig, dtype: torch.dtype, matched: bool
):
    # matched: the preloaded step is the matched loop's, so its bits are those of matched_loads.
    cfg = replace(cfg, matched_loads=matched)
    packed = weight(qtype, n, k)
    x = torch.randn(1, k, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE)
    for kwargs in ({}, {"bias": bias}):
        plain = quant_matvec(x, packed, qtype, n, k, config=cfg, **kwargs)
        out = torch.full((1, n), float("nan"), dtype=dtype, device=DEVICE)
        got = quant_matvec(x, packed, qtype, n, k, out=out, config=replace(cfg, preload=True), **kwargs)
        assert torch.equal(got, plain), kwargs


@TYPES
@pytest.mark.parametrize("matched", [False, True], ids=["plain", "matched"])
def test_preload_matches_reference(qtype: T, matched: bool):
    check(qtype, 1, 37, 7 * 32, torch.float32, MatvecConfig(8, 256, 1, matched_loads=matched, preload=True))


@TYPES
def test_preload_reaches_the_kernel(qtype: T, monkeypatch: pytest.MonkeyPatch):
    # Bitwise equality alone would also pass if the launcher dropped the flag.
    kernel, unit = qm._KERNELS[qtype]
    recorder = LaunchRecorder(kernel)
    monkeypatch.setitem(qm._KERNELS, qtype, (recorder, unit))
    packed = weight(qtype, 21, 256)
    x = torch.randn(1, 256, device=DEVICE)
    preload = MatvecConfig(8, 256, preload=True)
    for cfg in (preload, MatvecConfig(8, 256), replace(preload, matched_loads=True)):
        quant_matvec(x, packed, qtype, 21, 256, config=cfg)
    assert [(s.get("PRELOAD", False), s.get("MATCHED", False)) for s in recorder.launches] == [
        (True, False),
        (False, False),
        (True, True),
    ]


@TYPES
def test_env_levels_reach_the_kernel(qtype: T, monkeypatch: pytest.MonkeyPatch):
    # A launch without a config: STRATA_MATVEC_PRELOAD=0 runs default_config's tile as it is, 1 the
    # one-step tile preloaded, matched (the default) the same with matched loads.
    kernel, unit = qm._KERNELS[qtype]
    recorder = LaunchRecorder(kernel)
    monkeypatch.setitem(qm._KERNELS, qtype, (recorder, unit))
    packed = weight(qtype, 21, 28 * 32)
    x = torch.randn(1, 28 * 32, device=DEVICE)
    for level in ("0", "1", "matched"):
        monkeypatch.setenv("STRATA_MATVEC_PRELOAD", level)
        quant_matvec(x, packed, qtype, 21, 28 * 32)
    monkeypatch.delenv("STRATA_MATVEC_PRELOAD")
    quant_matvec(x, packed, qtype, 21, 28 * 32)
    plain = qm.default_config(qtype, 1, 21, 28 * 32).block_k
    seen = [(s["BLOCK_K"], s.get("PRELOAD", False), s.get("MATCHED", False)) for s in recorder.launches]
    assert seen == [(plain, False, False), (1024, True, False), (1024, True, True), (1024, True, True)]


@TYPES
def test_preload_refuses_what_it_does_not_implement(qtype: T):
    n, k = 21, 8 * 32
    packed = weight(qtype, n, k)
    x = torch.randn(2, k, device=DEVICE)
    one_step = MatvecConfig(8, 256, 1, preload=True)
    with pytest.raises(
        ValueError, match="preload is implemented in Q4_K's and Q6_K's int8_x kernels and, for one row"
    ):
        quant_matvec(x, packed, qtype, n, k, config=one_step)  # two rows
    with pytest.raises(
        ValueError, match=r"one K step a program, not 2.00 \(k=256 split 1 ways, block_k=128\)"
    ):
        quant_matvec(x[:1], packed, qtype, n, k, config=MatvecConfig(8, 128, 1, preload=True))
    with pytest.raises(ValueError, match="the matched or the lanes. step: give matched_loads=True"):
        quant_matvec(x[:1].bfloat16(), packed, qtype, n, k, config=replace(one_step, int8_x=True))
    if qtype == T.Q5_0:
        with pytest.raises(ValueError, match="runs the plain or the matched loop: not with flat_acc"):
            quant_matvec(x[:1], packed, qtype, n, k, config=replace(one_step, flat_acc=True))
    raw = random_weight(qtype, n, k, seed=4).to(DEVICE)
    with pytest.raises(ValueError, match="preload needs a weight packed once"):
        quant_matvec(x[:1], raw, qtype, n, k, config=one_step)
    q4k = pack_quant_weight(random_weight(T.Q4_K, n, k, seed=3).to(DEVICE), T.Q4_K, n, k)
    with pytest.raises(ValueError, match="not 1 rows of Q4_K"):
        quant_matvec(x[:1], q4k, T.Q4_K, n, k, config=one_step)


@TYPES
def test_env_preload_takes_k_in_one_step(qtype: T, monkeypatch: pytest.MonkeyPatch):
    # STRATA_MATVEC_PRELOAD=1: one row of fp32 x (config left to the launcher) runs preload_tile's
    # one-step tile, within the reference's tolerance; a weight of K over 2,048 keeps the default.
    packed = weight(qtype, 21, 28 * 32)
    tile = preload_tile(qm.default_config(qtype, 1, 21, 28 * 32), packed, False)
    assert (tile.block_k, tile.split_k, tile.num_warps, tile.preload) == (1024, 1, 8, True)
    wide = weight(qtype, 5, 48 * 32)  # K = 1,536: one step of 2,048, still 8 warps (registers)
    wide_tile = preload_tile(qm.default_config(qtype, 1, 5, 48 * 32), wide, False, matched=True)
    assert (wide_tile.block_k, wide_tile.num_warps, wide_tile.matched_loads) == (2048, 8, True)
    long = weight(qtype, 5, 72 * 32)
    assert not preload_tile(qm.default_config(qtype, 1, 5, 72 * 32), long, False).preload
    monkeypatch.setenv("STRATA_MATVEC_PRELOAD", "1")
    x = torch.randn(1, 28 * 32, device=DEVICE)
    assert torch.equal(
        quant_matvec(x, packed, qtype, 21, 28 * 32), quant_matvec(x, packed, qtype, 21, 28 * 32, config=tile)
    )
    check(qtype, 1, 21, 28 * 32, torch.float32, None)  # the launcher's own choice, under the env
    matched = replace(tile, matched_loads=True)
    assert preload_tile(qm.default_config(qtype, 1, 21, 28 * 32), packed, False, matched=True) == matched
    monkeypatch.setenv("STRATA_MATVEC_PRELOAD", "matched")
    assert torch.equal(
        quant_matvec(x, packed, qtype, 21, 28 * 32),
        quant_matvec(x, packed, qtype, 21, 28 * 32, config=matched),
    )
    check(qtype, 1, 21, 28 * 32, torch.float32, None)


def test_env_preload_levels(monkeypatch: pytest.MonkeyPatch):
    from strata import env

    monkeypatch.delenv("STRATA_MATVEC_PRELOAD", raising=False)
    assert env.matvec_preload() == "matched"
    for value in ("0", "1", "matched"):
        monkeypatch.setenv("STRATA_MATVEC_PRELOAD", value)
        assert env.matvec_preload() == value
    monkeypatch.setenv("STRATA_MATVEC_PRELOAD", "yes")
    with pytest.raises(
        ValueError, match="STRATA_MATVEC_PRELOAD='yes' must be 0, 1 or matched; unset it for matched"
    ):
        env.matvec_preload()


@pytest.mark.parametrize(
    "m,k,cfg",
    [
        (1, 256, MatvecConfig(8, 256, 1, int8_x=True, flat_acc=True, scalar_scales=True)),  # one step
        (1, 768, MatvecConfig(8, 256, 1, int8_x=True, flat_acc=True, scalar_scales=True, paired_dm=True)),
        (3, 768, MatvecConfig(8, 256, 2, int8_x=True)),  # rows one by one, split K
    ],
)
def test_q4k_int8_preload_is_bitwise_the_plain_loop(m: int, k: int, cfg: MatvecConfig):
    int8_preload_is_bitwise_the_plain_loop(T.Q4_K, m, k, cfg)


@pytest.mark.parametrize(
    "m,k,cfg",
    [
        (1, 256, MatvecConfig(16, 256, 1, int8_x=True)),  # one step
        (1, 768, MatvecConfig(16, 256, 1, int8_x=True, scalar_scales=True)),
        (3, 1024, MatvecConfig(8, 256, 2, int8_x=True)),
    ],
)
def test_q6k_int8_preload_is_bitwise_the_plain_loop(m: int, k: int, cfg: MatvecConfig):
    int8_preload_is_bitwise_the_plain_loop(T.Q6_K, m, k, cfg)


def int8_preload_is_bitwise_the_plain_loop(qtype: T, m: int, k: int, cfg: MatvecConfig) -> None:
    n = 21
    raw = random_weight(qtype, n, k, seed=k + m)
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k, "planar", q6k_layout="blocks")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    plain = quant_matvec(x, packed, qtype, n, k, config=cfg)
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=DEVICE)
    got = quant_matvec(x, packed, qtype, n, k, out=out, config=replace(cfg, preload=True))
    assert torch.equal(got, plain)


def test_env_preload_on_q4k_int8_takes_one_step_tiles_only():
    one = pack_quant_weight(random_weight(T.Q4_K, 8, 1536, seed=5), T.Q4_K, 8, 1536, "planar")
    cfg = MatvecConfig(8, 2048, 1, int8_x=None, flat_acc=True, scalar_scales=True)
    assert preload_tile(cfg, one, True).preload
    assert not preload_tile(replace(cfg, block_k=512), one, True).preload  # three steps
    assert not preload_tile(cfg, one, False).preload  # fp32 x: Q4_K's planar fp32 kernel has none
    assert not preload_tile(cfg, one, True, matched=True).preload  # the default level: fp32 x only


@pytest.mark.parametrize(
    "qtype,name", [(T.Q4_K, "q4_k_int8_matvec_kernel"), (T.Q6_K, "q6_k_int8_matvec_kernel")]
)
def test_int8_preload_reaches_the_kernel(qtype: T, name: str, monkeypatch: pytest.MonkeyPatch):
    # The int8 kernels' preload gives the plain loop's bits, so only a record shows it was launched.
    recorder = LaunchRecorder(getattr(im, name))
    monkeypatch.setattr(im, name, recorder)
    packed = pack_quant_weight(
        random_weight(qtype, 21, 256, seed=9).to(DEVICE), qtype, 21, 256, "planar", q6k_layout="blocks"
    )
    x = torch.randn(1, 256, device=DEVICE).bfloat16()
    cfg = MatvecConfig(16, 256, 1, int8_x=True)
    quant_matvec(x, packed, qtype, 21, 256, config=replace(cfg, preload=True))
    quant_matvec(x, packed, qtype, 21, 256, config=cfg)
    monkeypatch.setenv("STRATA_MATVEC_PRELOAD", "1")
    monkeypatch.setenv("STRATA_INT8_X", "Q4_K+Q6_K")
    quant_matvec(x, packed, qtype, 21, 256)  # the default tile takes K = 256 in one step
    assert [s["PRELOAD"] for s in recorder.launches] == [True, False, True]
