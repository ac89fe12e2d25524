"""Release wheels for `inv baseline --pypi`: fetch one wheel into kpremote's cache and read named files out of it.

A wheel is fetched with pip's own client (`pip download --no-deps --only-binary=:all:`, so nothing is built and no
code from it runs), kept in the cache as `<cache>/wheels/<wheel file name>` and always identified by its sha256.
The cache is `$KPREMOTE_CACHE/wheels/`, else `~/.cache/kpremote/wheels/`. Re-fetching a pinned wheel asks pip for
exactly that file: the distribution and version from its name, and its python/abi/platform tags, so a machine with
another Python picks the same bytes. Files are read from the zip by exact name (never by extracting it), each a
regular file of bounded size.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..agent.provenance import file_sha256
from ..errors import WheelError

CACHE_ENV = "KPREMOTE_CACHE"
PIP_TIMEOUT_S = 900.0
MAX_MEMBER_BYTES = 16 * 1024 * 1024  # one source file; a larger member is refused, not read
# name-version(-build)?-python-abi-platform.whl (PEP 427); names and versions hold no '-' there.
WHEEL_NAME = re.compile(r"(?P<dist>[^-/]+)-(?P<version>[^-/]+)(?:-(?P<build>\d[^-/]*))?"
                        r"-(?P<python>[^-/]+)-(?P<abi>[^-/]+)-(?P<platform>[^-/]+)\.whl")


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str
    sha256: str

    @property
    def tags(self) -> str:
        """The python-abi-platform part of the name, e.g. cp311-cp311-manylinux_2_34_x86_64."""
        match = parse_name(self.name)
        return f"{match['python']}-{match['abi']}-{match['platform']}"

    @property
    def release(self) -> str:
        """'<distribution> <version>', e.g. 'sglang 0.5.23'."""
        match = parse_name(self.name)
        return f"{match['dist']} {match['version']}"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or str(Path("~/.cache/kpremote").expanduser())
    return Path(root) / "wheels"


def parse_name(name: str) -> dict[str, str]:
    match = WHEEL_NAME.fullmatch(name)
    if not match:
        raise WheelError(f"{name!r} is not a wheel file name (name-version-python-abi-platform.whl)")
    return match.groupdict()


# ------------------------------------------------------------------------------------------------ getting one

def fetch_requirement(spec: str) -> Wheel:
    """`--pypi` for a new pin: a local .whl path (copied into the cache) or a requirement such as sglang==0.5.23."""
    local = Path(spec).expanduser()
    if spec.endswith(".whl"):
        if not local.is_file():
            raise WheelError(f"--pypi {spec}: no such wheel file")
        parse_name(local.name)
        return into_cache(local)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*", spec):
        raise WheelError(f"--pypi {spec!r}: give an exact release, e.g. sglang==0.5.23, or a path to a .whl file")
    return pip_download(spec, [])


def obtain(name: str, sha256: str) -> Wheel:
    """The pinned wheel: from the cache, else downloaded by pip as exactly that file; its sha256 must match."""
    parse_name(name)
    cached = cache_dir() / name
    if cached.is_file() and file_sha256(cached) == sha256:
        return Wheel(cached, name, sha256)
    fields = parse_name(name)
    wheel = pip_download(f"{fields['dist']}=={fields['version']}", tag_options(fields))
    if wheel.name != name:
        raise WheelError(f"pip download gave {wheel.name}, not the pinned {name}")
    if wheel.sha256 != sha256:
        raise WheelError(f"{name}: sha256 {wheel.sha256} from the index differs from the pinned {sha256} — refused")
    return wheel


def tag_options(fields: dict[str, str]) -> list[str]:
    """pip download options that select the wheel with these tags, whatever Python runs pip."""
    python = fields["python"].split(".")[0]
    if not re.fullmatch(r"cp\d+", python):
        return []  # a pure wheel (py3-none-any) is the same file everywhere
    options = ["--implementation", "cp", "--python-version", python[2:], "--abi", fields["abi"].split(".")[0]]
    for platform in fields["platform"].split("."):  # compressed tag sets: a.b → --platform a --platform b
        options += ["--platform", platform]
    return options


def pip_download(requirement: str, options: list[str]) -> Wheel:
    """One wheel, no dependencies, no source builds, into a scratch folder and then the cache."""
    with tempfile.TemporaryDirectory(prefix="kpremote-wheel-") as scratch:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                "--no-input", "--dest", scratch, *options, requirement]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise WheelError(f"pip download {requirement} took longer than {PIP_TIMEOUT_S:.0f}s") from None
        if done.returncode:
            raise WheelError(f"cannot download {requirement} with pip: {pip_reason(done.stderr)}")
        wheels = sorted(Path(scratch).glob("*.whl"))
        if len(wheels) != 1:
            raise WheelError(f"pip download {requirement} gave {len(wheels)} wheels, expected one")
        return into_cache(wheels[0])


def pip_reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["no message"])[0]


def into_cache(path: Path) -> Wheel:
    """Copy a wheel into the cache (atomically, under its own name) and return it with its sha256."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if path.resolve() != target.resolve():
        handle, staging = tempfile.mkstemp(prefix=".incoming-", dir=folder)
        os.close(handle)
        try:
            shutil.copyfile(path, staging)
            os.replace(staging, target)
        finally:
            Path(staging).unlink(missing_ok=True)
    return Wheel(target, target.name, file_sha256(target))


# ------------------------------------------------------------------------------------------------ reading files

def read_members(wheel: Wheel, paths: list[str]) -> dict[str, bytes]:
    """{path: bytes} for each path, read from the wheel by exact member name; each must be a regular file."""
    try:
        archive = zipfile.ZipFile(wheel.path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{wheel.name}: not a readable wheel ({exc})") from None
    with archive:
        members = {info.filename: info for info in archive.infolist()}
        return {path: read_member(archive, members, wheel.name, path) for path in paths}


def read_member(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], wheel: str, path: str) -> bytes:
    info = members.get(path)
    if info is None:
        folder = f"{path}/" in members
        raise WheelError(f"{path} is {'a folder' if folder else 'not in'} {wheel}"
                         + (" — list the files themselves" if folder else " (paths are as the wheel holds them, "
                            "e.g. sglang/kernels/...)"))
    mode = info.external_attr >> 16
    if info.is_dir() or stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # no type bits: a plain file (zip's default)
        raise WheelError(f"{path} in {wheel} is not a regular file (a link or a special file): refused")
    if info.file_size > MAX_MEMBER_BYTES:
        raise WheelError(f"{path} in {wheel} is {info.file_size} bytes, over {MAX_MEMBER_BYTES}: refused")
    with archive.open(info) as member:
        data = member.read(MAX_MEMBER_BYTES + 1)
    if len(data) > MAX_MEMBER_BYTES:
        raise WheelError(f"{path} in {wheel} inflates past {MAX_MEMBER_BYTES} bytes: refused")
    return data
