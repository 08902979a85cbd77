"""`astra survey`: which kernels are worth optimizing. Every selected spec (reviewed, or a probed draft) is
benched on its suite, and the kernels are ranked by the time they leave above their practical floor,
weighted by a serving mix and by whether SGLang's runtime reaches them.

Modules (this package imports nothing of the CLI; its `__init__` imports none of its modules):

- `bench`:   `bench_one` (one kernel's bench: a picklable top-level function for any executor),
             `BenchTask`, `BenchResult`, `serial_run` (the default `Run`: in process, one after another);
- `store`:   the survey directory, one JSON record per kernel written atomically, resume rules;
- `run`:     selecting the specs, planning what is not current, running and recording;
- `reach`:   srt call sites and gates of a kernel (warm, gated, cold, unknown) and the ranking factors;
- `mixes`:   serving mixes (astra/data/serving_mixes.yaml, or a file) as weights over token counts;
- `rank`:    recoverable time, geomean x above the practical floor, worst case, the order;
- `summary`, `html`, `svg`, `report`: the terminal table, markdown, JSON, the static HTML page and
             its inline SVG charts, and writing the report files.
"""
