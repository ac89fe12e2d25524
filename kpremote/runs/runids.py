"""Run ids as people type them: the whole id, `latest`, or any unique part of it — its start (20261123-1314) or its
random tail (d69ae1) — resolved against the ids that exist, with a clear line when it names none or several."""

from __future__ import annotations

import re
from typing import Iterable

from ..errors import KpremoteError

FULL_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
PART_OF_ID = re.compile(r"^[0-9a-f-]{1,40}$")


def is_full_id(wanted: str) -> bool:
    return bool(FULL_ID.match(wanted))


def check_run_word(wanted: str) -> None:
    """Refuse at once what cannot name a run (before any host is asked)."""
    if wanted != "latest" and not PART_OF_ID.match(wanted):
        raise KpremoteError(f"bad run id {wanted!r}: expected YYYYMMDD-HHMMSS-xxxxxx, a unique part of one, or latest")


def resolve_run_id(wanted: str, ids: Iterable[str], where: str) -> str:
    """The one id that `wanted` names among ids (oldest first, so `latest` is the last); where: for the message."""
    check_run_word(wanted)
    ids = list(ids)
    if wanted == "latest":
        if not ids:
            raise KpremoteError(f"no runs {where}, so no latest one")
        return ids[-1]
    if wanted in ids:
        return wanted
    matches = [i for i in ids if i.startswith(wanted) or i.endswith(wanted)] if wanted else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[-5:])
        raise KpremoteError(f"run id {wanted!r} names {len(matches)} runs {where} ({shown}): give more of it")
    hint = f"; the newest: {', '.join(ids[-3:])}" if ids else ""
    raise KpremoteError(f"no run {wanted!r} {where}{hint}")

