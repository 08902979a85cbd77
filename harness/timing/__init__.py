"""GPU timing: the two timing modes, original and candidate interleaved (`modes`), the statistics of their
samples (`stats`), the GPU's performance model (`perf_model`), the floors and the suspect rule (`roofline`),
copies timed for reference (`copy_reference`), and the cross-check with Nsight Compute (`ncu_cross_check`)."""
