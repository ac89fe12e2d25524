"""The regimes a row is timed in, and the contexts a row may name (bench/context.py's CONTEXTS): loaded and checked
here, by the judge and by each side (which runs a context's before() and after() around its call). What the judge does
with them is regimes.py's.
"""

from __future__ import annotations

from typing import Any

COLD, WARM, CONTEXT = "cold", "warm", "context"
REGIMES = (COLD, WARM, CONTEXT)
CONTEXT_REGIMES = (WARM, CONTEXT)  # timed only for a row that names a context, after its cold samples


class ContextProblem(Exception):
    """bench/context.py or the context a row names cannot serve: the row's ERROR, in these words."""


def load_context(spec: Any, name: str) -> Any:
    """The contract.Context bench/context.py's CONTEXTS holds under `name`, its declaration checked; ContextProblem
    says what is wrong. The file is imported once per process (kp_context), from its source."""
    from ..contract import Context
    from ..task import build

    try:
        module = build.import_context(spec)
    except Exception as exc:  # noqa: BLE001 - a context that does not import is the row's ERROR
        raise ContextProblem(f"bench/context.py: {type(exc).__name__}: {exc}") from None
    contexts = getattr(module, "CONTEXTS", None)
    if not isinstance(contexts, dict) or name not in contexts:
        raise ContextProblem(f"bench/context.py: CONTEXTS has no {name!r} (it has "
                             f"{', '.join(map(repr, contexts)) if isinstance(contexts, dict) else 'no dict'})")
    context = contexts[name]
    if not isinstance(context, Context):
        raise ContextProblem(f"bench/context.py: CONTEXTS[{name!r}] is a {type(context).__name__}, not a "
                             f"kpremote.agent.contract.Context")
    for key in ("writes", "results"):
        names = getattr(context, key)
        if not isinstance(names, tuple) or not names or not all(isinstance(n, str) and n for n in names):
            what = "the kernel inputs before() writes" if key == "writes" else "the state tensors after() writes"
            raise ContextProblem(f"bench/context.py: CONTEXTS[{name!r}].{key} = {names!r}: a tuple of one or more "
                                 f"names ({what})")
    for key in ("state", "before", "after"):
        if not callable(getattr(context, key)):
            raise ContextProblem(f"bench/context.py: CONTEXTS[{name!r}].{key} is not callable")
    return context
