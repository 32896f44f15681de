"""StepInputs: a captured decode step's inputs, uploaded in one copy (the CPU's copy stands in for
the GPU's; the graphs' equality with eager steps is tested on the GPU in test_model_runner_graphs)."""

from __future__ import annotations

import pytest
import torch

from strata.engine.step_inputs import StepInputs

SCRATCH, BLOCK = 99, 16


def make() -> StepInputs:
    return StepInputs(8, 5, torch.device("cpu"), SCRATCH, BLOCK)


def assert_rows(inputs: StepInputs, ids, positions, slots, tables) -> None:
    """The device views' rows 0 .. len(ids) - 1 hold the step, each table up to its context."""
    v = inputs.device_views
    rows = len(ids)
    assert v.ids[:rows].tolist() == ids
    assert v.positions[:rows].tolist() == positions
    assert v.slots[:rows].tolist() == slots
    assert v.context_lens[:rows].tolist() == [p + 1 for p in positions]
    for row, table in enumerate(tables):
        assert v.block_tables[row, : len(table)].tolist() == table


def test_starts_as_padding_and_holds_one_step_padded_to_its_size():
    inputs = make()
    v = inputs.device_views
    assert v.ids.tolist() == [0] * 8 and v.positions.tolist() == [0] * 8
    assert v.slots.tolist() == [SCRATCH * BLOCK] * 8 and v.context_lens.tolist() == [1] * 8
    assert (v.block_tables == SCRATCH).all()
    big_slot = 3_000_000_000  # past int32: the int64 views keep it
    inputs.upload(4, [5, 6, 7], [3, 20, 40], [17, 36, big_slot], [[1], [2, 3], [4, 5, 6]])
    assert_rows(
        inputs,
        [5, 6, 7, 0],
        [3, 20, 40, 0],
        [17, 36, big_slot, SCRATCH * BLOCK],
        [[1], [2, 3], [4, 5, 6], [SCRATCH]],
    )


def test_a_later_smaller_step_overwrites_its_rows_only_on_the_device():
    inputs = make()
    inputs.upload(8, list(range(8)), list(range(8)), list(range(8)), [[r] for r in range(8)])
    inputs.upload(2, [11], [64], [70], [[7, 8, 9, 10, 11]])
    assert_rows(inputs, [11, 0], [64, 0], [70, SCRATCH * BLOCK], [[7, 8, 9, 10, 11], [SCRATCH]])
    # Rows past the step's size are not copied: the device keeps the earlier step's.
    assert inputs.device_views.block_tables[2:, 0].tolist() == list(range(2, 8))
    # The host twin is another buffer: writing it changes nothing on the device until an upload.
    inputs.host_views.ids[0] = 123
    assert inputs.device_views.ids[0].item() == 11


@pytest.mark.parametrize("size, rows", [(2, 3), (9, 1), (4, 0)])
def test_refuses_a_step_that_does_not_fit(size, rows):
    with pytest.raises(ValueError, match="rows <= size <= 8"):
        make().upload(size, [1] * rows, [0] * rows, [0] * rows, [[0]] * rows)
