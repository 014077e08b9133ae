"""kvlib/measure/timing.py: the measuring helper counts its runs, restores threads and records its setting."""

import pytest
import torch

from kvlib.measure.timing import Timing, environment, measure, num_threads


def test_measure_warms_up_then_repeats():
    """Check that measure runs warmup + repeats calls and keeps one sample per repeat."""
    calls = []
    timing = measure(lambda: calls.append(1), name="noop", warmup=3, repeats=5, seq_len=7)
    assert len(calls) == 8 and len(timing.samples) == 5
    assert all(s >= 0 for s in timing.samples)
    assert timing.record["seq_len"] == 7 and timing.record["threads"] == 1


def test_timing_median_and_spread():
    """Check that Timing gives the median and spread of a known list of samples."""
    t = Timing("x", [3.0, 1.0, 2.0, 10.0, 2.5])
    assert t.median == 2.5 and t.spread == (1.0, 10.0)
    assert "median 2.50 s" in str(t) and t.as_dict()["median"] == 2.5


def test_num_threads_restores_the_setting():
    """Check that num_threads sets torch's thread count inside the block and restores it after."""
    before = torch.get_num_threads()
    with num_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="at least 1"):
        with num_threads(0):
            pass


def test_environment_records_what_produced_a_number():
    """Check that the record names device, threads and torch version, plus extra fields."""
    env = environment("cpu", dtype="float32")
    assert {"device", "device_type", "threads", "torch", "dtype"} <= set(env)
    assert env["device_type"] == "cpu" and env["torch"] == torch.__version__


def test_measure_rejects_zero_repeats():
    """Check that repeats=0 is a clear error, not an empty median."""
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        measure(lambda: None, repeats=0)


def test_replayable_is_the_function_itself_off_a_gpu():
    """Check that replayable() changes nothing on a CPU (a CUDA graph exists only on a GPU)."""
    from kvlib.measure.timing import replayable

    def fn():
        return 1

    assert replayable(fn, "cpu") is fn
