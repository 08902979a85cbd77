"""The kernels worth optimizing first, from a survey: `astra eval`'s targets when no kernel list is given."""

from __future__ import annotations

from pathlib import Path

from astra.errors import BadInput
from astra.survey import mixes, rank
from astra.survey.store import Store, latest


def survey_targets(top: int = 10, store_dir: str | None = None, view: str = "graph") -> list[str]:
    """The `top` kernels with the most recoverable time in a survey (the latest one under
    $ASTRA_HOME/surveys unless `store_dir` names one)."""
    root = Path(store_dir) if store_dir else latest()
    if root is None or not root.is_dir():
        raise BadInput("no survey to take the targets from: run `astra survey --all --reviewed` on a GPU machine "
                       "first, or name the kernels with --kernels")
    ranking = rank.rank(Store(root).records(), view, mixes.load_mix(None))
    names = [k.name for k in ranking.ranked()][:top]
    if not names:
        raise BadInput(f"the survey in {root} ranks no kernel: run `astra survey` there again, or name --kernels")
    return names
