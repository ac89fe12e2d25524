"""BOOT: the few lines the client runs as `PYTHON -c BOOT ROOT HASH SUBCOMMAND ARGS...` on a host.

It finds the agent shipped under ROOT/agent/HASH (exit 97 when it is not there, so the client ships it and
tries again) and calls kpremote.agent.__main__.main([SUBCOMMAND, *ARGS, "--root", ROOT]). `ship` is handled
by BOOT itself, stdlib only, because the agent is exactly what is missing then; `ship -- SUBCOMMAND ARGS`
goes on to run that subcommand, so shipping and the call it was for cost one channel (stdin belongs to the
tar then: a chained call gets no stdin of its own).

The ship code below is the one implementation: BOOT contains its text, and the agent's own `ship`
subcommand uses the very same function.
"""

from __future__ import annotations

from .protocol import ExitCode

NOT_SHIPPED = int(ExitCode.AGENT_MISSING)

SHIP_SOURCE = r'''
def ship(dest, stream):
    """Extract the agent tar from stream into dest: regular files and folders only, then .complete, atomically."""
    import shutil, tarfile, tempfile
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".ship-", dir=parent)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                if member.name.startswith("/") or ".." in parts or not (member.isreg() or member.isdir()):
                    raise ValueError(f"refusing tar member {member.name!r} (only relative files and folders)")
                path = os.path.join(tmp, *parts)
                if member.isdir():
                    os.makedirs(path, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as out:
                    shutil.copyfileobj(tar.extractfile(member), out)
        open(os.path.join(tmp, ".complete"), "w").close()
        try:
            os.rename(tmp, dest)
        except OSError:
            if not os.path.exists(os.path.join(dest, ".complete")):  # else a concurrent ship won: same content
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
'''

ENTRY_SOURCE = r'''
if len(sys.argv) < 4 or not sys.argv[2].isalnum():
    sys.exit("kpremote boot: usage: python -c BOOT ROOT HASH SUBCOMMAND [ARGS...] (HASH: letters and digits)")
root, digest, argv = os.path.expanduser(sys.argv[1]), sys.argv[2], sys.argv[3:]
home = os.path.join(root, "agent", digest)
if argv[0] == "ship":
    try:
        ship(home, sys.stdin.buffer)
    except Exception as exc:
        sys.exit(f"kpremote ship to {home}: {exc}")
    argv = argv[2:] if argv[1:2] == ["--"] else []
    if not argv:
        print('{"ok": true}')
        sys.exit(0)
if not os.path.isfile(os.path.join(home, ".complete")):
    sys.stderr.write(f"kpremote: agent {digest} is not shipped to {root}\n")
    sys.exit(NOT_SHIPPED)
sys.path.insert(0, home)
os.environ["KPREMOTE_ROOT"] = root
from kpremote.agent.__main__ import main
sys.exit(main([*argv, "--root", root]))
'''

BOOT: str = f"import os, sys\nNOT_SHIPPED = {NOT_SHIPPED}\n" + SHIP_SOURCE + ENTRY_SOURCE


def _load_ship():
    namespace: dict = {}
    exec("import os\n" + SHIP_SOURCE, namespace)  # noqa: S102 - our own constant, shared with BOOT
    return namespace["ship"]


ship = _load_ship()
