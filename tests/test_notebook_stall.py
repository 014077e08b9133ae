"""Notebook 01's stall stays fixed: no wait for a kernel reply outlasts the reply by more than a step.

The stall: with plain nbclient, one run in 20 of notebook 01 waited its whole per-cell timeout for an
execute_reply the kernel had sent seconds before (a zmq.asyncio wake-up lost while the widget cell
floods iopub), then finished without an error. kvlib.grading.execute.poll_in_steps makes every wait
poll the socket in 0.5 s steps; these tests hold it, on a simulated lost wake-up and on real runs.
"""

import asyncio
import time
from datetime import datetime
from queue import Empty
from types import SimpleNamespace

import nbformat
import pytest
from conftest import ROOT
from nbgrader.validator import Validator
from traitlets.config import Config

from kvlib.app import lab
from kvlib.grading.execute import poll_in_steps

NOTEBOOK_01 = ROOT / "solutions" / "01-attention" / "attention.ipynb"


class LostWakeupChannel:
    """A channel whose get_msg behaves as pyzmq's did in the stall: a message that arrives during a
    wait is noticed only when that wait's timeout fires (pyzmq then polls the socket itself)."""

    def __init__(self):
        self.ready_at = None  # monotonic time the message arrives

    async def get_msg(self, timeout=None):
        start = time.monotonic()
        await asyncio.sleep(timeout if timeout is not None else 3600)
        if self.ready_at is not None and self.ready_at <= time.monotonic():
            return {"msg_type": "execute_reply", "waited": time.monotonic() - start}
        raise Empty


async def _wait_for_reply(channel, arrives_after, timeout):
    channel.ready_at = time.monotonic() + arrives_after
    start = time.monotonic()
    msg = await channel.get_msg(timeout=timeout)
    return msg, time.monotonic() - start


def test_poll_in_steps_notices_a_reply_whose_wakeup_was_lost():
    """Check that a reply arriving 0.2 s into a 30 s wait is returned within a step, not after 30 s."""
    kc = SimpleNamespace(shell_channel=LostWakeupChannel(), iopub_channel=LostWakeupChannel())
    poll_in_steps(kc)
    msg, waited = asyncio.run(_wait_for_reply(kc.shell_channel, arrives_after=0.2, timeout=30))
    assert msg["msg_type"] == "execute_reply"
    # one 0.5 s step is the most a lost wake-up costs; 10 s is far from both that and the 30 s timeout
    assert waited < 10, f"the reply arrived after 0.2 s but the wait returned after {waited:.1f} s"


def test_poll_in_steps_still_times_out_when_no_reply_comes():
    """Check that stepped waits keep the caller's timeout: no message in 1.2 s raises Empty."""
    kc = poll_in_steps(SimpleNamespace(shell_channel=LostWakeupChannel(), iopub_channel=LostWakeupChannel()))
    with pytest.raises(Empty):
        asyncio.run(kc.iopub_channel.get_msg(timeout=1.2))


def _kernel_clock(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.slow
def test_notebook_01_runs_show_no_wait_outside_the_kernel():
    """Check that in three fresh-kernel runs of notebook 01 (as `kvlib present --check` runs it), the time the
    client spends outside the kernel's own clock (start, shutdown, waits for replies) stays under 30 s.

    This asserts on a hang, not on speed: normally it is 1-3 s (kernel start and shutdown), and the stall
    made it the whole 60 s timeout. Three runs catch a stall that comes back at its old rate (one run in 20)
    about one time in seven, and every run of the suite adds three more (the notebook's other runs: its test,
    the browser, Validate, grading all wait through the same stepped client); the simulated test above catches
    a lost stepped wait every time.
    """
    outside = []
    for _ in range(3):
        start = time.time()
        run = lab.run_notebook(NOTEBOOK_01, timeout=60)
        end = time.time()
        assert run.error is None, run.error
        stamps = [c.metadata["execution"] for c in run.notebook.cells if c.cell_type == "code"]
        kernel_span = _kernel_clock(stamps[-1]["iopub.status.idle"]) - _kernel_clock(stamps[0]["iopub.status.busy"])
        after_last = end - _kernel_clock(stamps[-1]["iopub.status.idle"])
        outside.append((round(end - start - kernel_span, 1), round(after_last, 1)))
    print("seconds outside the kernel's clock, and after the last cell:", outside)
    worst = max(o for o, _ in outside)
    assert worst < 30, f"a run waited {worst} s outside the kernel's clock (stall back?): {outside}"


def test_validate_uses_the_stepped_kernel_client():
    """Check that nbgrader's Validate, configured by nbgrader_config.py, waits through SteppedKernelClient."""
    config = Config()
    exec((ROOT / "nbgrader_config.py").read_text(), {"get_config": lambda: config})
    validator = Validator(config=config)
    execute = validator.preprocessors[-1](parent=validator)
    execute.nb = nbformat.read(NOTEBOOK_01, as_version=4)
    client = execute.create_kernel_manager().client()
    assert type(client).__name__ == "SteppedKernelClient", type(client)
    assert client.shell_channel_class.__name__ == "SteppedChannel"
