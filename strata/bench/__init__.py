"""`strata bench`: timing strata against itself (another commit, other options) and against peers.

The harness (`ab`, `command`) starts one worker process per arm (`worker`), which loads its model once
and answers measurement requests over JSON lines. A worker of `strata@REV` imports strata from a git
worktree of REV; this package is copied next to it as `_strata_bench`, so every module here imports
its siblings relatively and imports nothing from `strata.bench` by absolute name.
The product never imports this package.
"""
