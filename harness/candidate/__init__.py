"""The candidate process, the only process that runs candidate code (`process`), the judge's handle on it
(`run`), and what it hands the judge on disk (`exchange`)."""
