"""The per-origin gate of the HTTP(S) data plane (providers/_http/throttle.py):
additive increase, multiplicative decrease on a throttle of a request sent at
the current width, a quick return to just below the width last throttled at,
waits bounded by deadlines and cancellation, waiting requests let in in order
with a throttled thread's retry first."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tensorstream.providers._http import throttle
from tensorstream.providers._http.throttle import DECREASE, RECOVER, Gate


def test_an_origin_that_never_throttles_is_never_limited() -> None:
    gate = Gate()
    slots = [gate.enter() for _ in range(100)]
    assert all(s is not None for s in slots) and gate.in_flight == 100
    for s in slots:
        assert s is not None
        s.leave(206)
    assert gate.limit is None and gate.in_flight == 0 and gate.cuts == 0


def test_a_throttle_cuts_the_width_once_per_width() -> None:
    gate = Gate()
    slots = [gate.enter() for _ in range(10)]
    assert all(s is not None for s in slots)
    slots[0].leave(503)  # type: ignore[union-attr]
    assert gate.limit == pytest.approx(10 * DECREASE) and gate.cuts == 1
    # Throttles of requests sent before the cut tell of the old width: no second cut.
    for s in slots[1:5]:
        s.leave(429)  # type: ignore[union-attr]
    assert gate.cuts == 1 and gate.in_flight == 5
    # A request sent at the new width and throttled cuts again.
    for s in slots[5:]:
        s.leave(206)  # type: ignore[union-attr]
    again = [gate.enter(), gate.enter()]
    again[0].leave(503)  # type: ignore[union-attr]
    assert gate.cuts == 2 and gate.limit == pytest.approx(1.4)
    # Leaving twice is leaving once.
    again[0].leave(503)  # type: ignore[union-attr]
    assert gate.in_flight == 1
    again[1].leave(206)  # type: ignore[union-attr]
    # A request throttled alone (an outage, another client) cuts nothing.
    alone = gate.enter()
    assert alone is not None
    alone.leave(503)
    assert gate.cuts == 2 and gate.in_flight == 0


def test_the_limit_is_forgotten_some_time_after_the_last_cut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate()
    slots = [gate.enter() for _ in range(4)]
    slots[0].leave(503)  # type: ignore[union-attr]
    assert gate.limit is not None
    monkeypatch.setattr(throttle, "FORGET", 0.1)
    time.sleep(0.2)
    more = [gate.enter(deadline=time.monotonic() + 1) for _ in range(10)]
    assert all(s is not None for s in more) and gate.limit is None
    for s in [*slots[1:], *more]:
        s.leave(206)  # type: ignore[union-attr]


def _answer(gate: Gate, n: int, status: int = 200) -> None:
    for _ in range(n):
        s = gate.enter()
        assert s is not None
        s.leave(status)


def test_answers_return_quickly_below_the_ceiling_then_widen_by_one_per_width() -> None:
    gate = Gate()
    first = [gate.enter() for _ in range(10)]
    first[0].leave(503)  # type: ignore[union-attr]
    for s in first[1:]:
        s.leave(None)  # no answer (a reset): the limit does not move
    assert gate.limit == pytest.approx(7.0) and gate.ceiling == 10
    _answer(gate, 1)
    assert gate.limit == pytest.approx(7.0 + RECOVER)
    _answer(gate, 3)  # 7 + 4 x 0.5 = 9: one below the width throttled at, no further
    assert gate.limit == pytest.approx(9.0)
    _answer(gate, 9)  # then one more request per limit's worth of answers
    assert 9.9 < (gate.limit or 0) < 10.1


def test_a_throttle_at_the_ceiling_again_cuts_to_just_below_it() -> None:
    gate = Gate()
    first = [gate.enter() for _ in range(10)]
    first[0].leave(503)  # type: ignore[union-attr]
    for s in first[1:]:
        s.leave(206)  # type: ignore[union-attr]
    _answer(gate, 30)
    assert (gate.limit or 0) > 10  # grown back past the ceiling
    at = [gate.enter(deadline=time.monotonic() + 1) for _ in range(10)]
    at[0].leave(503)  # type: ignore[union-attr]  # the same width failed again
    assert gate.limit == pytest.approx(9.0) and gate.ceiling == 10 and gate.cuts == 2
    for s in at[1:]:
        s.leave(206)  # type: ignore[union-attr]
    # A throttle below the ceiling: the server takes less than it did, cut deep.
    below = [gate.enter(deadline=time.monotonic() + 1) for _ in range(6)]
    below[0].leave(503)  # type: ignore[union-attr]
    assert gate.limit == pytest.approx(6 * DECREASE) and gate.ceiling == 6
    for s in below[1:]:
        s.leave(206)  # type: ignore[union-attr]


def test_waiting_requests_go_in_order_and_a_throttled_threads_retry_first() -> None:
    gate = Gate()
    held = [gate.enter() for _ in range(2)]
    held[0].leave(503)  # type: ignore[union-attr]  # limit 1.4: one at a time
    order: list[str] = []
    retry_ready = threading.Event()
    go_retry = threading.Event()

    def waiter(name: str) -> None:
        s = gate.enter(deadline=time.monotonic() + 5)
        assert s is not None
        order.append(name)
        time.sleep(0.2)  # the others queue meanwhile
        s.leave(None)  # (no answer: the limit stays at one)

    def retrier() -> None:
        s = gate.enter(deadline=time.monotonic() + 5)  # first in the queue
        assert s is not None
        order.append("first try")
        s.leave(503)  # throttled: this thread's next request goes first
        retry_ready.set()
        go_retry.wait(5)
        waiter("retry")

    threads = [threading.Thread(target=waiter, args=(f"w{i}",)) for i in range(3)]
    r = threading.Thread(target=retrier)
    r.start()
    time.sleep(0.05)
    for t in threads:
        t.start()
        time.sleep(0.05)  # queue in a known order
    held[1].leave(None)  # type: ignore[union-attr]  # a slot frees: the queue moves
    assert retry_ready.wait(5)
    time.sleep(0.05)  # w0 holds the slot now, w1 and w2 wait
    go_retry.set()
    time.sleep(0.05)  # the retry joins the queue last, and goes first
    for t in [*threads, r]:
        t.join(5)
    assert order[0] == "first try" and order[1] == "w0"
    assert order.index("retry") < order.index("w1") < order.index("w2")


def test_a_slot_that_comes_free_wakes_the_first_in_line_not_every_waiter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With 20 requests waiting on a limit of one, each answer wakes the one
    request that may go: every waiter wakes about once (its turn), where waking
    them all made ~7 wake-ups per waiter here (148 looks) (and, in a load on a server that
    takes 8 requests at once, ~60k context switches)."""
    monkeypatch.setattr(throttle, "_POLL", 30.0)  # no wake-ups but the gate's own
    gate = Gate()
    held = [gate.enter() for _ in range(2)]
    held[0].leave(503)  # type: ignore[union-attr]  # limit 1.4: one at a time
    checks: list[str] = []  # one per time a waiter looks at the gate
    order: list[str] = []

    def waiter(name: str) -> None:
        s = gate.enter(deadline=time.monotonic() + 10,
                       cancelled=lambda: checks.append(name) is not None)
        assert s is not None
        order.append(name)
        s.leave(None)  # (no answer: the limit stays where it is)

    threads = [threading.Thread(target=waiter, args=(f"w{i:02d}",)) for i in range(20)]
    for t in threads:
        t.start()
        time.sleep(0.01)  # queue in a known order
    time.sleep(0.05)
    assert not order and len(checks) == 20  # each looked once, and waits
    held[1].leave(None)  # type: ignore[union-attr]  # one slot frees: the line moves
    for t in threads:
        t.join(10)
    assert order == sorted(order)  # in the order they came
    assert len(checks) <= 2 * 20 + 2, f"{len(checks)} looks for 20 waiters"


def test_a_full_gate_holds_a_request_until_one_leaves() -> None:
    gate = Gate()
    slots = [gate.enter() for _ in range(2)]
    slots[0].leave(503)  # type: ignore[union-attr]  # limit 1.4: one at a time
    got: list[float] = []

    def waiter() -> None:
        began = time.monotonic()
        s = gate.enter(deadline=time.monotonic() + 5)
        got.append(time.monotonic() - began)
        assert s is not None
        s.leave(200)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    assert not got  # still waiting: one request is in flight, the limit is one
    slots[1].leave(200)  # type: ignore[union-attr]
    t.join(5)
    assert got and 0.15 < got[0] < 2


def test_a_wait_ends_at_the_deadline_or_on_cancellation() -> None:
    gate = Gate()
    held = [gate.enter() for _ in range(2)]
    held[0].leave(503)
    began = time.monotonic()
    assert gate.enter(deadline=time.monotonic() + 0.2) is None
    assert 0.15 < time.monotonic() - began < 1
    began = time.monotonic()
    assert gate.enter(cancelled=lambda: time.monotonic() - began > 0.2) is None
    assert time.monotonic() - began < 1
    held[1].leave(200)  # type: ignore[union-attr]


def test_shared_tells_whether_other_requests_are_in_flight() -> None:
    gate = Gate()
    alone = gate.enter()
    assert alone is not None and not gate.shared()
    other = gate.enter()
    assert other is not None and gate.shared()
    other.leave(206)
    assert not gate.shared()
    alone.leave(503)


def test_gates_are_per_origin_and_a_forked_child_starts_afresh() -> None:
    a = throttle.gate(("http", "127.0.0.1", 1))
    assert throttle.gate(("http", "127.0.0.1", 1)) is a
    assert throttle.gate(("https", "127.0.0.1", 1)) is not a
    s = a.enter()
    assert s is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = throttle.gate(("http", "127.0.0.1", 1)).in_flight == 0
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    s.leave(200)


def test_a_wait_for_a_slot_ends_after_max_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # A thread holding one body open must never wait on itself for ever.
    gate = Gate()
    held = [gate.enter() for _ in range(2)]
    held[0].leave(503)  # limit 1.4, one in flight: full
    monkeypatch.setattr(throttle, "MAX_WAIT", 0.3)
    began = time.monotonic()
    extra = gate.enter()
    assert extra is not None and 0.25 < time.monotonic() - began < 2
    assert gate.in_flight == 2
    extra.leave(206)
    held[1].leave(206)  # type: ignore[union-attr]
