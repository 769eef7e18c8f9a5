"""The scale bench's reading of the Go runtime's GC trace: lines as the API server
writes them with GODEBUG=gctrace=1, and the CPU of a window set beside them."""

from __future__ import annotations

import os
import time

import pytest
from bench.gotrace import parse_cycles, process_started, spent_in

# Two lines of a kube-apiserver log from a scale run, with a klog line between them.
LOG = """\
gc 72 @367.314s 2%: 2.6+776+0.009 ms clock, 5.3+230/393/0+0.019 ms cpu, 478->566->296 MB, 563 MB goal, 2 MB stacks, 0 MB globals, 2 P
I1201 23:09:26.201771    9974 trace.go:236] Trace[1]: "Patch" (total time: 512ms)
gc 73 @368.790s 2%: 1.2+738+0.007 ms clock, 2.5+199/380/0+0.015 ms cpu, 508->601->310 MB, 597 MB goal, 2 MB stacks, 0 MB globals, 2 P
"""
STARTED = 1_000.0


def test_each_cycle_is_read_with_its_start_clock_and_cpu() -> None:
    cycles = parse_cycles(LOG, STARTED)
    assert len(cycles) == 2
    start, clock, cpu = cycles[0]
    assert start == pytest.approx(1_367.314)
    assert clock == pytest.approx((2.6 + 776 + 0.009) / 1000)
    assert cpu == pytest.approx((5.3 + 230 + 393 + 0 + 0.019) / 1000)


def test_a_window_gets_the_share_of_each_cycle_it_overlaps() -> None:
    cycles = [(10.0, 1.0, 0.6), (20.0, 0.5, 0.4)]
    assert spent_in(cycles, 0.0, 30.0) == pytest.approx((2, 1.0))
    # Half of the first cycle's clock time falls inside: half its CPU.
    assert spent_in(cycles, 10.5, 15.0) == pytest.approx((1, 0.3))
    assert spent_in(cycles, 12.0, 19.0) == (0, 0.0)


def test_a_cycle_with_no_clock_time_counts_whole_where_it_starts() -> None:
    assert spent_in([(5.0, 0.0, 0.2)], 4.0, 6.0) == pytest.approx((1, 0.2))
    assert spent_in([(5.0, 0.0, 0.2)], 6.0, 7.0) == (0, 0.0)


def test_lines_that_are_not_gc_cycles_are_left_out() -> None:
    text = "scvg: 0 MB released\ngc 1 @0.015s 3%: bad\nI1201 23:03:18 serving.go:405] x\n"
    assert parse_cycles(text, STARTED) == []


def test_this_process_started_before_now_and_after_the_machine_booted() -> None:
    started = process_started(os.getpid())
    assert started <= time.time()
    assert started > time.time() - time.monotonic() - 5
