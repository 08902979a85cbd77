"""The default catalog is what the committed survey says: the passes that built for at least ten modules."""

import json
from pathlib import Path

from astra.optimize.passes import DEFAULT, PASSES, all_passes

RESULTS = Path(__file__).resolve().parents[4] / "docs" / "results" / "passes-0.5.23.json"


def test_default_catalog_follows_the_committed_survey():
    data = json.loads(RESULTS.read_text())
    assert data["built"] and data["sglang"] == "0.5.23"
    assert set(data["passes"]) == set(all_passes())
    building = {name for name, outcome in data["passes"].items() if len(outcome["builds"]) >= 10}
    assert set(DEFAULT) == building == set(PASSES)


def test_every_pass_names_itself_and_its_family():
    for name, rewrite in all_passes().items():
        assert rewrite.name == name and rewrite.family
        result = rewrite.apply("int plain_host_code() { return 1; }\n")
        assert not result.applies and result.source is None and result.reason
