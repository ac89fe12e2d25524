from __future__ import annotations

import importlib.metadata
import io
import json
import platform
import subprocess
import sys
import tarfile
import types

import pytest

from kpremote.agent.__main__ import main
from kpremote.agent.boot import BOOT, NOT_SHIPPED, ship
from kpremote.agent.lease import IdlePolicy, acquire
from kpremote.hosts.agentclient import agent_bundle


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_info_reports_versions_and_asks_torch_about_cuda_only_when_not_fast(capsys):
    torch_was_imported = "torch" in sys.modules
    assert main(["info", "--fast"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert ("torch" in sys.modules) == torch_was_imported, "info --fast imported torch"
    assert fast["python"] == platform.python_version()
    assert fast["torch"] == importlib.metadata.version("torch")
    assert fast["pynvml"] == importlib.metadata.version("nvidia-ml-py")
    assert set(fast) == {"hostname", "python", "torch", "triton", "pynvml", "tvm_ffi", "cutlass_dsl", "cuda",
                         "cuda_available", "sandbox"}
    assert fast["sandbox"] == "sandboxed"  # this kernel has Landlock, seccomp and user namespaces
    assert fast["tvm_ffi"] == _installed("apache-tvm-ffi") and fast["cutlass_dsl"] == _installed("nvidia-cutlass-dsl")
    assert fast["cuda_available"] is None

    assert main(["info"]) == 0
    full = json.loads(capsys.readouterr().out)
    import torch

    assert (fast["cuda"], full["cuda"], full["cuda_available"]) == (
        torch.version.cuda, torch.version.cuda, torch.cuda.is_available())


def test_probe_shows_idle_verdict_lease_and_arch_per_gpu(tmp_path, nvml_fixture, make_gpu, capsys):
    nvml_fixture(make_gpu(0), make_gpu(1, memory_used_mib=3000),
                 make_gpu(2, cc=[10, 0], name="NVIDIA B200", memory_total_mib=183359))
    held = acquire(tmp_path, policy=IdlePolicy(), arch="any", run_id="20250101-000000-aaaaaa", task="t", gpu="0")

    assert main(["probe", "--root", str(tmp_path), "--idle", '{"max_memory_mib": 1000}', "--arch", "b200"]) == 0

    report = json.loads(capsys.readouterr().out)
    assert report["source"] == "fixture"
    gpu0, gpu1, gpu2 = report["gpus"]
    assert gpu0["lease"]["run_id"] == "20250101-000000-aaaaaa" and gpu1["lease"] is None
    assert (gpu1["idle"], gpu1["reason"]) == (False, "3000 MiB used > 1000 MiB")
    assert [g["arch_ok"] for g in report["gpus"]] == [False, False, True]
    assert [g["arch_reason"] for g in report["gpus"]] == [
        "GPU 0 (NVIDIA H200) is not a B200", "GPU 1 (NVIDIA H200) is not a B200", None]
    held.release()


def test_probe_on_an_h200_host_says_an_h100_does_not_fit(tmp_path, nvml_fixture, make_gpu, capsys):
    # Both are compute capability 9.0: only the model tells an h200 host's H100 apart.
    nvml_fixture(make_gpu(0), make_gpu(1, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559))

    assert main(["probe", "--root", str(tmp_path), "--arch", "h200"]) == 0

    h200, h100 = json.loads(capsys.readouterr().out)["gpus"]
    assert (h200["arch_ok"], h200["arch_reason"]) == (True, None)
    assert (h100["arch_ok"], h100["arch_reason"]) == (False, "GPU 1 (NVIDIA H100 80GB HBM3) is not an H200")


def test_probe_never_imports_torch(tmp_path, agent_env, python):
    code = (
        "import sys; from kpremote.agent.__main__ import main; "
        f"assert main(['probe', '--root', {str(tmp_path)!r}]) == 0; "
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'probe imported torch'"
    )
    done = subprocess.run([python, "-c", code], env=agent_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpus"][0]["idle"] is True


@pytest.mark.parametrize(
    "argv, kind",
    [
        (["bogus"], "usage"),
        (["follow", "--task", "t"], "usage"),
        (["probe", "--idle", "{nope"], "bad_request"),
        (["probe", "--arch", "a100"], "bad_request"),
        (["follow", "--task", "t", "--run", "../../etc"], "bad_request"),
        (["cancel", "--task", "t", "--run", "20250101-000000-abcdef"], "not_found"),
    ],
)
def test_expected_failures_are_one_json_line_and_a_nonzero_exit(tmp_path, nvml_fixture, argv, kind, capsys):
    code = main([*argv, "--root", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code != 0
    assert json.loads(out)["error"] == kind and len(out.splitlines()) == 1
    assert "Traceback" not in err


def test_run_and_sync_apply_get_their_arguments_untouched(monkeypatch):
    seen = {}
    for name, dotted in (("runner", "kpremote.agent.run.runner"), ("sync", "kpremote.agent.sync")):
        module = types.ModuleType(dotted)
        module.main = lambda argv, name=name: seen.setdefault(name, argv) and 7
        monkeypatch.setitem(sys.modules, dotted, module)

    assert main(["run", "--task-dir", "d", "--run-dir", "r", "--root", "/x"]) == 7
    assert main(["sync-apply", "--task", "t", "--root", "/x"]) == 7
    assert seen == {"runner": ["--task-dir", "d", "--run-dir", "r", "--root", "/x"],
                    "sync": ["--task", "t", "--root", "/x"]}


# ------------------------------------------------------------------------------------------ ship and BOOT


def tar_of(*members: tuple[str, bytes | None, bytes]) -> bytes:
    """members: (name, tar type, data) -> an uncompressed tar."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.linkname = data.decode()
                tar.addfile(info)
    return buffer.getvalue()


def agent_tar() -> bytes:
    """The tar the client ships (its folders and all), so BOOT is tested on what a host really gets."""
    return agent_bundle()[1]


def test_ship_extracts_files_and_marks_the_folder_complete(tmp_path):
    dest = tmp_path / "agent" / "abc123"
    ship(str(dest), io.BytesIO(tar_of(("pkg", tarfile.DIRTYPE, b""), ("pkg/a.py", tarfile.REGTYPE, b"x = 1\n"))))
    assert (dest / "pkg" / "a.py").read_text() == "x = 1\n"
    assert (dest / ".complete").is_file()
    assert [p.name for p in (tmp_path / "agent").iterdir()] == ["abc123"]  # no temp folder left behind


@pytest.mark.parametrize(
    "member",
    [
        ("../evil.py", tarfile.REGTYPE, b"x"),
        ("pkg/../../evil.py", tarfile.REGTYPE, b"x"),
        ("/tmp/evil.py", tarfile.REGTYPE, b"x"),
        ("pkg/link", tarfile.SYMTYPE, b"/etc/passwd"),
        ("pkg/hard", tarfile.LNKTYPE, b"pkg/a.py"),
        ("pkg/fifo", tarfile.FIFOTYPE, b""),
    ],
)
def test_ship_refuses_unsafe_members_and_leaves_nothing(tmp_path, member):
    dest = tmp_path / "agent" / "abc123"
    data = tar_of(("pkg/a.py", tarfile.REGTYPE, b"ok"), member)
    with pytest.raises(ValueError, match="refusing tar member"):
        ship(str(dest), io.BytesIO(data))
    assert list((tmp_path / "agent").iterdir()) == []
    assert not (tmp_path / "evil.py").exists()


def test_ship_subcommand_refusal_is_a_json_error(tmp_path, monkeypatch, capsys):
    data = tar_of(("../evil.py", tarfile.REGTYPE, b"x"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["ship", "--dest", str(tmp_path / "d")]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "bad_request"


def boot(python: str, root: str, digest: str, *argv: str, stdin: bytes = b"", env=None):
    return subprocess.run([python, "-c", BOOT, root, digest, *argv], input=stdin, capture_output=True, env=env,
                          timeout=60)


def test_boot_exits_97_until_shipped_then_ships_and_calls_in_one_go(tmp_path, agent_env, python):
    env = {**agent_env, "HOME": str(tmp_path), "PYTHONPATH": ""}  # only the shipped copy may be importable

    missing = boot(python, "~/kp", "deadbeef", "status", env=env)
    assert missing.returncode == NOT_SHIPPED
    assert missing.stdout == b"" and b"not shipped" in missing.stderr

    shipped = boot(python, "~/kp", "deadbeef", "ship", "--", "probe", "--idle", "{}", stdin=agent_tar(), env=env)
    assert shipped.returncode == 0, shipped.stderr
    assert json.loads(shipped.stdout)["gpus"][0]["idle"] is True  # only the chained call's JSON
    assert (tmp_path / "kp" / "agent" / "deadbeef" / ".complete").is_file()

    status = boot(python, "~/kp", "deadbeef", "status", env=env)
    assert (status.returncode, json.loads(status.stdout)) == (0, {"runs": []})

    again = boot(python, str(tmp_path / "kp"), "deadbeef", "ship", stdin=agent_tar(), env=env)
    assert (again.returncode, json.loads(again.stdout)) == (0, {"ok": True})  # a second ship of the same hash


@pytest.mark.parametrize("digest", ["../x", "a/b", ""])
def test_boot_refuses_a_hash_that_is_not_a_plain_name(tmp_path, python, digest):
    done = boot(python, str(tmp_path), digest, "info")
    assert done.returncode not in (0, NOT_SHIPPED) and b"usage" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_boot_ship_refusal_is_one_line_and_installs_nothing(tmp_path, python):
    done = boot(python, str(tmp_path), "abc", "ship", stdin=tar_of(("/etc/evil", tarfile.REGTYPE, b"x")))
    assert done.returncode == 1 and done.stderr.count(b"\n") == 1 and b"refusing" in done.stderr
    assert not (tmp_path / "agent" / "abc").exists()
