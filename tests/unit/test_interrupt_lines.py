"""What Ctrl-C says of a run whose cancel was not answered in time: sent on the run's own connection (the usual case
on a loaded link, where the run is cancelled by the time the answer comes) is not said as a failure to cancel."""

from __future__ import annotations

import threading

from kpremote.runs.interrupt import Cancels, Registry
from kpremote.transport.base import Command, Completed, Transport
from kpremote.transport.streams import Output


class AnswersLate(Transport):
    """A live connection whose answer comes only when the test lets it."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.answer = threading.Event()

    def send(self, command: Command) -> Completed:
        self.asked.set()
        self.answer.wait(10)
        output = Output(command)
        output.stdout(b'{"cancelled": true, "state": {"status": "cancelled", "pgid": 1}}\n')
        return output.completed(0)


def test_a_cancel_sent_but_answered_late_is_said_as_sent_not_as_unconfirmed(host):
    registry = Registry()
    late = AnswersLate()
    registry.add(host, "demo", "20261126-070000-abcdef", transport=late)
    lines: list[str] = []
    try:
        Cancels(registry, budget_s=0.3).finish(lines.append)
    finally:
        late.answer.set()
    assert late.asked.is_set()
    assert lines == ["run 20261126-070000-abcdef on unit: cancel sent, its answer did not come within 0.3 s; see "
                     "whether it still runs with: inv status --host unit"]
