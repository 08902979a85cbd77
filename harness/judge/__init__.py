"""The judge: `evaluate(job)` decides a candidate's verdict without running its code (`evaluate`). Inputs per
case and trial (`inputs`), correctness of a case (`correctness`, with the comparisons of `compare`), the
candidate's timings checked (`timings`) and its timed calls matched to its checked ones (`timed_outputs`),
the verdict (`verdict`) and the one acceptance rule (`acceptance`)."""
