"""Where an arm's strata code comes from (the working tree, or a git worktree of a revision), and the
copy of this package that every worker runs, so an old tree without `strata/bench` can be timed."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .arms import ArmSpec

HARNESS_ROOT = Path(__file__).resolve().parents[2]  # the tree holding this strata/bench
WORKER_PACKAGE = "_strata_bench"


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed in {root}: {done.stderr.strip()}")
    return done.stdout.strip()


@dataclass(frozen=True)
class ArmTree:
    root: Path  # the folder whose `strata` package the worker imports
    commit: str | None  # the checked-out commit; None for the working tree as it is


class Trees:
    """Owns the temporary folder: the worker package copy and one detached worktree per revision."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="strata-bench-"))
        self._worktrees: dict[str, ArmTree] = {}
        self.package_root = self.tmp / "pkg"  # holds _strata_bench/; also the workers' cwd
        target = self.package_root / WORKER_PACKAGE
        target.mkdir(parents=True)
        for source in Path(__file__).parent.glob("*.py"):
            shutil.copy2(source, target / source.name)

    def tree_for(self, spec: ArmSpec) -> ArmTree:
        if spec.rev is None:
            return ArmTree(HARNESS_ROOT, None)
        if not (HARNESS_ROOT / ".git").exists():
            raise ValueError(f"arm {spec}: {HARNESS_ROOT} is not a git checkout, so no revision can be timed")
        commit = git(HARNESS_ROOT, "rev-parse", "--verify", "--quiet", f"{spec.rev}^{{commit}}")
        if commit not in self._worktrees:
            path = self.tmp / f"tree-{commit[:12]}"
            git(HARNESS_ROOT, "worktree", "add", "--detach", "--quiet", str(path), commit)
            self._worktrees[commit] = ArmTree(path, commit)
        return self._worktrees[commit]

    def close(self) -> None:
        for tree in self._worktrees.values():
            git(HARNESS_ROOT, "worktree", "remove", "--force", str(tree.root))
        self._worktrees.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Trees:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
