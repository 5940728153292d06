"""The per-origin gate of the HTTP(S) data plane (providers/_http/throttle.py):
additive increase, multiplicative decrease on a throttle of a request sent at
the current width, waits bounded by deadlines and cancellation."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tensorstream.providers._http import throttle
from tensorstream.providers._http.throttle import DECREASE, Gate


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


def test_answers_widen_the_limit_by_one_per_width() -> None:
    gate = Gate()
    first = [gate.enter() for _ in range(10)]
    first[0].leave(503)  # type: ignore[union-attr]
    for s in first[1:]:
        s.leave(None)  # no answer (a reset): the limit does not move
    assert gate.limit == pytest.approx(7.0)
    for _ in range(7):
        s = gate.enter()
        assert s is not None
        s.leave(200)
    assert 7.9 < (gate.limit or 0) < 8.1


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
