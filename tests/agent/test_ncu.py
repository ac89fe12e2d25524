"""kpremote/agent/ncu/ncu.py: finding ncu, its command lines, its failures, reading its raw CSV, the roofline
verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from kpremote.agent.ncu import ncu
from kpremote.agent.protocol import SECTION_SETS, ProfileRequest

REPO = Path(__file__).resolve().parents[2]
SAMPLE = (REPO / "tests" / "fixtures" / "ncu" / "raw.csv").read_text()


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


# --------------------------------------------------------------------------------------------- finding ncu


def test_ncu_is_found_on_path_then_cuda_home_then_install_folders(tmp_path: Path):
    on_path = executable(tmp_path / "bin" / "ncu")
    in_cuda = executable(tmp_path / "cuda" / "bin" / "ncu")
    executable(tmp_path / "opt" / "2025.9.0" / "ncu")
    newer = executable(tmp_path / "opt" / "2025.10.0" / "ncu")
    folders = [str(tmp_path / "opt" / "*" / "ncu")]
    empty = str(tmp_path / "nothing")
    assert ncu.find_ncu({"PATH": str(on_path.parent), "CUDA_HOME": str(tmp_path / "cuda")}, folders) == str(on_path)
    assert ncu.find_ncu({"PATH": empty, "CUDA_HOME": str(tmp_path / "cuda")}, folders) == str(in_cuda)
    assert ncu.find_ncu({"PATH": empty}, folders) == str(newer)  # the newest install folder
    assert ncu.find_ncu({"PATH": empty}, []) is None


def test_kpremote_ncu_wins_and_a_bad_one_is_named(tmp_path: Path):
    chosen = executable(tmp_path / "x" / "my-ncu")
    on_path = executable(tmp_path / "bin" / "ncu")
    assert ncu.find_ncu({"PATH": str(on_path.parent), ncu.NCU_ENV: str(chosen)}, []) == str(chosen)
    with pytest.raises(ncu.NcuError, match="KPREMOTE_NCU=/no/such/ncu is not an executable ncu"):
        ncu.require_ncu({"PATH": str(on_path.parent), ncu.NCU_ENV: "/no/such/ncu"}, [])


def test_missing_ncu_is_one_line_saying_what_to_do(tmp_path: Path):
    with pytest.raises(ncu.NcuError) as caught:
        ncu.require_ncu({"PATH": str(tmp_path)}, [])
    assert caught.value.kind == "ncu_missing"
    message = str(caught.value)
    assert "\n" not in message and "not found on this host" in message and "install Nsight Compute" in message


# --------------------------------------------------------------------------------------------- command lines


def test_profile_command_never_changes_clocks_and_profiles_only_the_marked_region(tmp_path: Path):
    report = tmp_path / "raw" / "ncu" / "baseline-w.ncu-rep"
    target = ["python", "-m", "kpremote.agent.run.profile", "call", "--job", "j.json"]
    command = ncu.profile_command("/x/ncu", section_set="basic", kernel_regex="^_k(ernel)?$", report=report,
                                  target=target)
    pairs = list(zip(command, command[1:]))
    assert ("--clock-control", "none") in pairs
    assert ("--profile-from-start", "off") in pairs
    assert ("--set", "basic") in pairs and ("--section", "WarpStateStats") in pairs
    assert ("--kernel-name", "regex:^_k(ernel)?$") in pairs
    assert ("--export", str(report)) in pairs and "--force-overwrite" in command
    assert command[-len(target):] == target  # the profiled command comes last, untouched
    metrics = command[command.index("--metrics") + 1].split(",")
    assert "dram__bytes_read.sum" in metrics and "gpu__time_duration.sum" in metrics

    full = ncu.profile_command("/x/ncu", section_set="full", kernel_regex=None, report=report, target=target)
    assert ("--set", "full") in zip(full, full[1:]) and "--kernel-name" not in full
    # the sections the summary reads are named whatever the set, so --metrics never narrows what is collected
    assert {b for a, b in zip(full, full[1:]) if a == "--section"} >= {"SpeedOfLight", "Occupancy", "WarpStateStats"}


def test_import_reads_the_raw_page_in_base_units(tmp_path: Path):
    command = ncu.import_command("/x/ncu", tmp_path / "r.ncu-rep")
    assert command[:3] == ["/x/ncu", "--import", str(tmp_path / "r.ncu-rep")]
    assert {"--csv", "raw", "base"} <= set(command)


# --------------------------------------------------------------------------------------------- failures


def check(tmp_path: Path, output: str, returncode: int = 0, *, report: bool = False, finished: bool = True,
          regex: str | None = None) -> ncu.NcuError | None:
    path = tmp_path / "r.ncu-rep"
    if report:
        path.write_text("report")
    try:
        ncu.check_profile(output, returncode, path, target_finished=finished, kernel_regex=regex)
    except ncu.NcuError as exc:
        return exc
    return None


PERMISSION_OUTPUT = ("==PROF== Connected to process 4242\n==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                     "permission to access NVIDIA GPU Performance Counters on the target device 0.\n")


def test_no_permission_to_the_counters_says_what_to_do(tmp_path: Path):
    error = check(tmp_path, PERMISSION_OUTPUT, 0, finished=True)
    assert error is not None and error.kind == "counter_permission"
    assert str(error).startswith("no permission to GPU performance counters: run with --cap-add=SYS_ADMIN or set "
                                 "NVreg_RestrictProfilingToAdminUsers=0")


def test_a_regex_that_matched_nothing_is_named(tmp_path: Path):
    error = check(tmp_path, "==WARNING== No kernels were profiled.\n", regex="nope")
    assert error is not None and error.kind == "no_kernels" and "'nope' matched no kernel" in str(error)
    silent = check(tmp_path, "==PROF== Disconnected from process 1\n")  # exit 0 and no report: nothing profiled
    assert silent is not None and silent.kind == "no_kernels" and "no kernel was launched" in str(silent)


def test_a_crashed_profiled_process_and_an_ncu_error_are_told_apart(tmp_path: Path):
    crashed = check(tmp_path, "Traceback (most recent call last):\nRuntimeError: boom\n", 1, finished=False)
    assert crashed is not None and crashed.kind == "target_failed" and "RuntimeError: boom" in str(crashed)
    failed = check(tmp_path, "==ERROR== Failed to profile kernel '_k' in process 7\n", 1)
    assert failed is not None and failed.kind == "ncu_failed" and "Failed to profile kernel" in str(failed)
    unknown = check(tmp_path, "==ERROR== Failed to find metric sm__nope.sum\n", 1)
    assert unknown is not None and "does not know a requested metric" in str(unknown)
    assert check(tmp_path, "==PROF== Report: r.ncu-rep\n", 0, report=True) is None


# --------------------------------------------------------------------------------------------- reading the CSV


def test_raw_csv_is_read_per_launch_past_preamble_units_and_separators():
    launches = ncu.parse_raw_csv("==PROF== Connected to process 4242\n" + SAMPLE)
    assert [launch.kernel for launch in launches] == ["_rmsnorm_row", "_rmsnorm_rows", "_rmsnorm_row"]
    first = launches[0]
    assert first.identity["Block Size"] == "(256, 1, 1)"
    assert first.metrics["gpu__time_duration.sum"] == pytest.approx(8216e-9)  # "8,216" nsecond, in seconds
    assert first.metrics["dram__bytes_read.sum"] == 12_582_912
    assert first.metrics["smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"] is None  # "n/a"
    assert ncu.parse_raw_csv("==ERROR== nothing here\n") == []


@pytest.mark.parametrize("unit, scale", [("nsecond", 1e-9), ("usecond", 1e-6), ("msecond", 1e-3), ("second", 1.0),
                                         ("Kbyte", 1e3), ("Gbyte/second", 1e9), ("byte/usecond", 1e6),
                                         ("Mhz", 1e6), ("%", 1.0), ("register/thread", 1.0), ("", 1.0)])
def test_units_scale_to_base(unit: str, scale: float):
    assert ncu.unit_scale(unit) == pytest.approx(scale)


def test_kernels_are_summarized_by_name_with_medians_and_top_stalls():
    baseline, small = ncu.summarize(ncu.parse_raw_csv(SAMPLE))
    assert (baseline.name, baseline.launches, small.launches) == ("_rmsnorm_row", 2, 1)
    assert baseline.duration_us == pytest.approx((8.216 + 8.400) / 2)
    assert baseline.grid == "(12288, 1, 1)" and baseline.block == "(256, 1, 1)"
    assert baseline.dram_bytes == pytest.approx((12_582_912 + 12_580_000) / 2 + 12_582_912)
    assert baseline.get("registers_per_thread") == 24 and small.get("shared_static_bytes") == 512
    assert baseline.get("dram_pct") == pytest.approx(77.95) and baseline.get("l2_hit_pct") == pytest.approx(12.5)
    assert [name for name, _ in baseline.stalls] == ["long_scoreboard", "wait", "not_selected"]  # 'selected' is not
    assert baseline.flop == 1_572_864 + 1_572_864 + 2 * 3_145_728  # fadd + fmul + 2 x ffma; hfma n/a; dadd 0
    assert baseline.peak_fp32_flop_per_s == pytest.approx(2 * 16_896 * 1.755e9)


def test_an_older_ncu_metric_name_still_counts():
    renamed = SAMPLE.replace("gpu__dram_throughput.avg", "dram__throughput.avg")
    [kernel, _] = ncu.summarize(ncu.parse_raw_csv(renamed))
    assert kernel.get("dram_pct") == pytest.approx(77.95)


# --------------------------------------------------------------------------------------------- roofline


def test_roofline_names_the_bound_against_the_copy_bandwidth():
    memory_bound, latency_bound = ncu.summarize(ncu.parse_raw_csv(SAMPLE))
    roof = ncu.roofline(memory_bound, copy_gbps=4000.0)
    assert roof.bytes_per_s == pytest.approx(memory_bound.dram_bytes / 8.308e-6)
    assert roof.memory_fraction == pytest.approx(roof.bytes_per_s / 4e12)
    assert roof.compute_fraction == pytest.approx(memory_bound.flop / 8.308e-6 / (2 * 16_896 * 1.755e9))
    assert roof.bound == "memory"
    assert ncu.roofline(latency_bound, copy_gbps=4000.0).bound == "latency"
    busy_sm = ncu.KernelSummary("mma", 1, None, None, {"duration_s": 1e-5, "sm_pct": 91.0, "dram_pct": 20.0})
    assert ncu.roofline(busy_sm, copy_gbps=None).bound == "compute"  # tensor work shows in SM SOL, not in FLOP
    assert ncu.roofline(ncu.KernelSummary("x", 1, None, None, {}), copy_gbps=4000.0).bound == "unknown"


# --------------------------------------------------------------------------------------------- the request


def test_profile_request_travels_as_json_and_refuses_nonsense():
    request = ProfileRequest(side="candidate", section_set="full", kernel="fused_.*", warmup=2, calls=5)
    assert ProfileRequest.from_json(request.to_json()) == request
    assert request.sides == ("candidate",) and ProfileRequest().sides == ("baseline", "candidate")
    assert request.problems() == []
    bad = ProfileRequest(side="solution", section_set="everything", kernel="(", calls=0)
    assert len(bad.problems()) == 4
    with pytest.raises(ValueError, match="not a profile request"):
        ProfileRequest.from_json("cold")
    with pytest.raises(ValueError, match="unknown profile request keys"):
        ProfileRequest.from_json('{"sets": "full"}')


def test_no_ncu_command_line_ever_sets_clocks(tmp_path: Path):
    for section_set in SECTION_SETS:
        command = ncu.profile_command("ncu", section_set=section_set, kernel_regex=None, report=tmp_path / "r",
                                      target=["t"])
        values = [b for a, b in zip(command, command[1:]) if a == "--clock-control"]
        assert values == ["none"]
