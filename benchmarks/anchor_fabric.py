"""Anchor (b): the straightforward Fabric script a user would write — `put` per file over SFTP, one `run` per step.

    python benchmarks/anchor_fabric.py --port P --key K --known-hosts KH sync SRC DEST
    python benchmarks/anchor_fabric.py --port P --key K --known-hosts KH run SRC DEST RUN_DIR PYTHON AGENT_HOME \
        [runner args...]

`sync` creates the folders (one `run`) and uploads every file (no change detection: a re-sync sends everything
again). `run` is the whole routine: sync, then the agent's runner in the foreground (one `run`), then every file
of the run's summary/ back with `get`. The host key is checked against KH (never added on first use).
"""

from __future__ import annotations

import argparse
import shlex
import stat
import sys
from pathlib import Path

import paramiko
from fabric import Config, Connection


def connect(port: int, key: str, known_hosts: str) -> Connection:
    connection = Connection("127.0.0.1", user="root", port=port,
                            config=Config(overrides={"load_ssh_configs": False}),
                            connect_kwargs={"key_filename": [key], "look_for_keys": False, "allow_agent": False})
    connection.client.load_host_keys(known_hosts)
    connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return connection


def files_under(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file())


def sync(c: Connection, src: Path, dest: str) -> int:
    files = files_under(src)
    folders = sorted({str(Path(dest, p.relative_to(src)).parent) for p in files} | {dest})
    c.run("mkdir -p " + " ".join(shlex.quote(f) for f in folders), hide=True)
    for path in files:
        c.put(str(path), f"{dest}/{path.relative_to(src).as_posix()}")
    return len(files)


def fetch_summary(c: Connection, run_dir: str, local: Path) -> int:
    """Every file of RUN_DIR/summary/ (folders included) into local/."""
    sftp = c.sftp()
    count = 0
    pending = [""]
    while pending:
        rel = pending.pop()
        for entry in sftp.listdir_attr(f"{run_dir}/summary/{rel}".rstrip("/")):
            name = f"{rel}/{entry.filename}" if rel else entry.filename
            if stat.S_ISDIR(entry.st_mode):
                pending.append(name)
            elif stat.S_ISREG(entry.st_mode):
                (local / name).parent.mkdir(parents=True, exist_ok=True)
                c.get(f"{run_dir}/summary/{name}", str(local / name))
                count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--known-hosts", required=True)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("sync")
    p.add_argument("src", type=Path)
    p.add_argument("dest")
    p = sub.add_parser("run")
    p.add_argument("src", type=Path)
    p.add_argument("dest")
    p.add_argument("run_dir")
    p.add_argument("python")
    p.add_argument("agent_home")
    p.add_argument("fetch_to", type=Path)
    p.add_argument("runner_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    with connect(args.port, args.key, args.known_hosts) as c:
        sent = sync(c, args.src, args.dest)
        if args.step == "sync":
            print(f"sent {sent} files")
            return
        runner = [args.python, "-m", "kpremote.agent", "run", "--task-dir", args.dest, "--run-dir", args.run_dir,
                  *args.runner_args]
        c.run(f"PYTHONPATH={shlex.quote(args.agent_home)} {shlex.join(runner)}", hide=True)
        fetched = fetch_summary(c, args.run_dir, args.fetch_to)
        print(f"sent {sent} files, fetched {fetched}")


if __name__ == "__main__":
    sys.exit(main())
