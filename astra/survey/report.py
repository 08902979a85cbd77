"""The survey's report files: `write(ranking, out_dir)` writes survey.md, survey.json and survey.html."""

from __future__ import annotations

from pathlib import Path

from astra.survey import html, summary
from astra.survey.rank import Ranking

FILES = ("survey.md", "survey.json", "survey.html")


def write(ranking: Ranking, out_dir: Path, store: Path | str | None = None, top: int | None = None) -> list[Path]:
    """survey.md, survey.json, survey.html in `out_dir` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in FILES]
    paths[0].write_text(summary.markdown(ranking, store, top))
    paths[1].write_text(summary.to_json(ranking, store) + "\n")
    paths[2].write_text(html.page(ranking, store, top))
    return paths
