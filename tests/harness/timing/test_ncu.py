"""Parsing Nsight Compute's CSV and grouping kernels by marker (the live run is GPU-only)."""

import pytest

from harness.timing import ncu_cross_check as ncu

CSV = '''==PROF== Connected to process 123 (/usr/bin/python3)
==PROF== Profiling "spin_kernel": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3","127.0.0.1","void at::native::normal_kernel<float>(...)","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","5,120"
"1","123","python3","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,024"
"2","123","python3","127.0.0.1","void sglang::rms_kernel<bf16>(...)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","3,500"
"3","123","python3","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,010"
"4","123","python3","127.0.0.1","void at::native::fill_kernel(...)","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","900"
"5","123","python3","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,000"
"6","123","python3","127.0.0.1","void sglang::stage1(...)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","12.5"
"7","123","python3","127.0.0.1","void sglang::stage2(...)","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","500"
"8","123","python3","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,000"
==PROF== Disconnected from process 123
'''


def test_parse_csv_units_and_order():
    kernels = ncu.parse_csv(CSV)
    assert len(kernels) == 9
    assert kernels[0] == ("void at::native::normal_kernel<float>(...)", 5120.0)
    assert kernels[6] == ("void sglang::stage1(...)", 12500.0)


def test_kernels_between_markers_belong_to_one_case():
    groups = ncu.split_by_markers(ncu.parse_csv(CSV))
    assert groups == [[3500.0], [12500.0, 500.0]]  # input preparation outside the markers is ignored


def test_marker_durations_are_the_empty_launch():
    assert ncu.marker_durations(ncu.parse_csv(CSV)) == [1024.0, 1010.0, 1000.0, 1000.0]


def test_missing_ncu_is_a_reason_not_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    result = ncu.cross_check(job=None)
    assert result["cases"] == {} and "ncu (Nsight Compute) not found" in result["skipped"]


@pytest.mark.gpu
@pytest.mark.network
def test_the_cross_check_times_every_timed_case_of_a_real_kernel(sglang_0523):
    """`astra bench --ncu`'s profiled worker on fused_add_rmsnorm: each timed case's kernels between its markers,
    the markers alone profiled besides (--profile-from-start off)."""
    from astra.spec import jobs
    from astra.spec import model as spec_mod

    if ncu.ncu_path() is None:
        pytest.skip("needs ncu (Nsight Compute)")
    job = jobs.make_job(spec_mod.load("fused_add_rmsnorm"), sglang_0523)
    timed = [case.id for case in job.cases if case.timed]
    job.cases = [case for case in job.cases if case.id in timed[:3]]
    result = ncu.cross_check(job, timeout_s=400)
    assert result["skipped"] is None, result
    assert sorted(result["cases"]) == sorted(timed[:3]) and all(us > 0 for us in result["cases"].values())
    assert result["empty_us"] is not None and result["empty_us"] > 0
