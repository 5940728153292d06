"""The read-ahead controller's rules, fed synthetic intervals (no network, no
clock): a starved stream goes wide at once, a try that does not pay is undone
and not retried for a while, a reader-bound wide reader tries the stream only
when one connection can feed it, and intervals mixed with old read-ahead are
never judged."""

from __future__ import annotations

from collections.abc import Callable

from tensorstream.readahead.control import (
    CALM_INTERVALS,
    FIRST_LOOK,
    FIRST_SURE,
    HOLD,
    IDLE_BYTES,
    INTERVAL,
    STREAM_RETRY,
    SURE,
    Controller,
    LoadProgress,
    Mode,
)

MB = 1_000_000


class Run:
    """Drives a controller through intervals of a given rate and wait share."""

    def __init__(self, **kwargs: object) -> None:
        self.now = 0.0
        self.ctl = Controller(now=self.now, **kwargs)  # type: ignore[arg-type]

    def interval(self, rate: float, waited: float, *, steady: bool = True) -> bool:
        self.ctl.observe(int(rate * INTERVAL), waited * INTERVAL, steady=steady)
        self.now += INTERVAL
        return self.ctl.tick(self.now)

    def settle(self, rate: float, waited: float) -> None:
        """The interval right after a change is never judged."""
        assert not self.interval(rate, waited)


def test_a_starved_stream_goes_to_the_ceiling_and_keeps_it_when_it_pays() -> None:
    run = Run(can_stream=True, base=4, max_width=32)
    assert (run.ctl.mode, run.ctl.width) == (Mode.STREAM, 1)
    assert run.interval(25 * MB, 0.98)  # one connection's rate: the link needs ~60
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)
    run.settle(100 * MB, 0.9)
    assert not run.interval(600 * MB, 0.1)  # 24x the stream: kept
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)
    assert run.ctl.history[-1].reason == "kept"


def test_a_stream_that_waits_nearly_all_of_its_first_look_goes_wide_early() -> None:
    run = Run(can_stream=True, base=4, max_width=32)
    span = FIRST_LOOK * 1.1
    run.ctl.observe(int(25 * MB * span), 0.95 * span)
    assert run.ctl.tick(span)  # a paced link: judged after FIRST_LOOK, not INTERVAL
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)


def test_a_reader_that_keeps_up_gets_its_whole_first_interval() -> None:
    run = Run(can_stream=True, base=4, max_width=32)
    span = FIRST_LOOK * 1.1
    run.ctl.observe(int(900 * MB * span), 0.5 * span)  # waited, but not most of the time
    assert not run.ctl.tick(span) and not run.ctl.history
    run.ctl.observe(int(900 * MB * span), 0.0)
    assert not run.ctl.tick(span + FIRST_LOOK)  # still inside the first interval: no look
    assert not run.ctl.history
    # After the first interval, the early look is over: a later interval is judged
    # only when a whole INTERVAL has passed.
    run.ctl.observe(int(900 * MB * INTERVAL), 0.0)
    assert not run.ctl.tick(INTERVAL * 1.01)
    assert run.ctl.last_rate > 0  # the first interval closed
    run.ctl.observe(int(25 * MB * span), 0.99 * span)
    assert not run.ctl.tick(INTERVAL * 1.01 + span)


def test_the_first_look_takes_a_wait_short_of_sure_as_a_paced_link() -> None:
    # A paced server's first chunk and the socket's buffer arrive at once: the first
    # look measures less wait than the link imposes, so FIRST_SURE, not SURE, decides it.
    waited = (FIRST_SURE + SURE) / 2
    run = Run(can_stream=True, base=4, max_width=32)
    span = FIRST_LOOK * 1.1
    run.ctl.observe(int(25 * MB * span), waited * span)
    assert run.ctl.tick(span)  # early, and at once
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)
    # The same wait later in a load is a moderate one: it must show twice.
    later = Run(can_stream=True, base=4, max_width=32)
    assert not later.interval(200 * MB, 0.0)
    assert not later.interval(25 * MB, waited)
    assert later.interval(25 * MB, waited) and later.ctl.mode is Mode.RANGED
    assert later.ctl.width < 32  # not SURE: a measured step, not the ceiling


def test_the_first_interval_starts_at_the_first_read_and_skips_first_bytes() -> None:
    # Made at open(); the header parsed; 0.5 s later the first read: that time is not
    # the link's. A stream's wait for its first byte (0.2 s) is not either.
    run = Run(can_stream=True, base=4, max_width=32)
    run.ctl.begin(0.5)
    run.ctl.exclude(0.2)
    span = FIRST_LOOK * 1.1
    run.ctl.observe(int(25 * MB * span), 0.9 * span)
    assert run.ctl.tick(0.7 + span)  # judged on its own span: starved
    assert run.ctl.mode is Mode.RANGED
    assert 20 * MB < run.ctl.last_rate < 30 * MB
    # begin() only moves the start of a first interval that saw nothing yet.
    again = Run(can_stream=True, base=4, max_width=32)
    again.ctl.observe(2 * IDLE_BYTES, 0.0)
    again.ctl.begin(5.0)
    again.ctl.tick(INTERVAL * 1.01)
    assert again.ctl.last_rate > 0  # the interval closed at INTERVAL: its start stayed at 0


def test_a_try_that_does_not_pay_is_undone_then_retried_narrower_after_a_hold() -> None:
    run = Run(can_stream=True, base=4, max_width=32)
    assert not run.interval(200 * MB, 0.0)  # (the first interval has rules of its own)
    assert not run.interval(200 * MB, 0.7)  # starved (a moderate wait must show twice)
    assert run.interval(200 * MB, 0.7)  # but the server is the limit
    assert run.ctl.width == 5  # 1.25 / (1 - 0.7), rounded up
    run.settle(200 * MB, 0.7)
    assert not run.interval(150 * MB, 0.7)  # not yet: connections may still ramp up
    assert run.interval(190 * MB, 0.7)  # still no gain: back to the stream
    assert (run.ctl.mode, run.ctl.width) == (Mode.STREAM, 1)
    assert "did not beat" in run.ctl.reason
    # Still starved, but held off for HOLD seconds.
    held = 0
    while not run.interval(200 * MB, 0.9):
        held += 1
    assert held * INTERVAL >= HOLD - INTERVAL
    # The next try goes half as far, however long the reader waited.
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 4)


def test_a_half_starved_stream_tries_a_few_connections_if_it_starves_twice() -> None:
    run = Run(can_stream=True, base=4, max_width=32)
    assert not run.interval(300 * MB, 0.3)  # a busy machine or server: keep the stream
    assert not run.interval(300 * MB, 0.3)
    assert not run.interval(300 * MB, 0.6)  # once: a hiccup
    assert not run.interval(300 * MB, 0.0)
    assert not run.interval(300 * MB, 0.6)
    assert run.interval(300 * MB, 0.6)  # twice in a row: the link
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 4)


def test_ranged_reading_widens_while_the_reader_starves_and_each_step_pays() -> None:
    run = Run(can_stream=False, base=4, max_width=16)
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 4)
    widths = [run.ctl.width]
    for _ in range(6):
        if run.interval(25 * MB * run.ctl.width, 0.3):  # each connection adds 25 MB/s
            widths.append(run.ctl.width)
            run.settle(25 * MB * run.ctl.width, 0.3)
    assert widths == [4, 8, 15, 16]  # by 1.25 / 0.7 each step, up to the ceiling
    starved = Run(can_stream=False, base=4, max_width=16)
    assert starved.interval(100 * MB, 0.9)
    assert starved.ctl.width == 16  # 90% waiting: the ceiling in one step


def test_a_reader_bound_wide_reader_tries_the_stream_only_if_one_connection_feeds_it() -> None:
    slow = Run(can_stream=True, base=4, max_width=32)
    slow.interval(25 * MB, 0.98)
    slow.settle(400 * MB, 0.0)
    slow.ctl.note_connection(25 * MB)  # each request's body: 25 MB/s (a paced link)
    for _ in range(3 * CALM_INTERVALS):
        assert not slow.interval(400 * MB, 0.0)
    assert slow.ctl.mode is Mode.RANGED

    fast = Run(can_stream=True, base=4, max_width=32)
    fast.interval(25 * MB, 0.98)  # a slow start (a busy server, a cold cache)
    fast.settle(400 * MB, 0.0)
    fast.ctl.note_connection(2000 * MB)  # the link has sped up: one connection suffices
    changed = [fast.interval(400 * MB, 0.0) for _ in range(CALM_INTERVALS + 1)]
    assert not any(changed)  # not right after the stream starved (a burst would fool it)
    changed = [fast.interval(400 * MB, 0.0)
               for _ in range(int(STREAM_RETRY / INTERVAL) + CALM_INTERVALS)]
    assert any(changed) and fast.ctl.mode is Mode.STREAM
    assert "try the stream" in fast.ctl.reason
    fast.settle(500 * MB, 0.0)
    assert not fast.interval(500 * MB, 0.0)  # not worse: the stream is kept
    assert fast.ctl.mode is Mode.STREAM and fast.ctl.history[-1].reason == "kept"


def test_intervals_mixed_with_read_ahead_of_another_mode_are_not_judged() -> None:
    run = Run(can_stream=True, base=4, max_width=32)
    assert not run.interval(25 * MB, 0.98, steady=False)
    assert run.ctl.mode is Mode.STREAM and run.ctl.changes == 0


def test_a_fixed_width_never_changes() -> None:
    run = Run(can_stream=False, base=4, max_width=32, fixed_width=4)
    for _ in range(10):
        assert not run.interval(1 * MB, 1.0)
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 4)


def test_readers_of_one_load_share_the_read_ahead_budget_fairly() -> None:
    from tensorstream.readahead.ranged import ReadaheadBudget

    budget = ReadaheadBudget(8)
    budget.join()
    budget.join()
    assert budget.take(4, 0) and not budget.take(1, 4)  # the first reader: its half
    assert budget.take(4, 0) and not budget.take(1, 4)  # the second still gets its half
    assert budget.take(2, 4, force=True)  # a read waiting on it may overdraw
    assert budget.held == 10 and budget.peak == 10
    budget.give(6)
    budget.leave()  # one reader left: the other may use the whole budget
    assert budget.take(4, 4)
    assert not budget.take(1, 8)


def test_a_stream_from_a_server_slow_to_answer_each_request_stays_a_stream() -> None:
    """moto reads the whole object for every ranged GET: a request waits ~0.3 s
    for its first byte. A stream waiting on such a server is better off than
    any number of 2 MiB ranged requests; on a paced link it is the reverse."""
    moto = Run(can_stream=True, base=4, max_width=32, part=2 << 20)
    moto.ctl.note_first_byte(0.3)
    for _ in range(5):
        assert not moto.interval(130 * MB, 0.9)
    assert moto.ctl.mode is Mode.STREAM
    paced = Run(can_stream=True, base=4, max_width=32, part=2 << 20)
    paced.ctl.note_first_byte(0.05)  # an object store's first byte, a 25 MB/s connection
    assert paced.interval(25 * MB, 0.9) and paced.ctl.mode is Mode.RANGED
    assert paced.ctl.width == 32


def test_a_stream_slow_to_answer_leaves_only_when_it_starves_steadily_and_tries_a_few() -> None:
    far = Run(can_stream=True, base=4, max_width=32, part=8 << 20)
    far.ctl.note_first_byte(0.2)  # a far region, or a busy server
    assert not far.interval(20 * MB, 0.95)
    assert not far.interval(200 * MB, 0.2)  # served in bursts: not a slow link
    assert not far.interval(20 * MB, 0.95)
    assert not far.interval(20 * MB, 0.95)
    assert far.interval(20 * MB, 0.95)  # three in a row
    assert (far.ctl.mode, far.ctl.width) == (Mode.RANGED, 4)


def test_a_stream_that_waits_half_the_time_on_average_leaves_after_two_intervals() -> None:
    """A stream's wait is an estimate, noisy around half the time on a paced
    link (bursting, then 25 MB/s per connection: 51%, 44%, 56%, 57%, 64%...):
    two intervals that waited half the time on average count as two starved
    ones, not only two that each did."""
    run = Run(can_stream=True, base=4, max_width=32)
    assert not run.interval(200 * MB, 0.0)  # (the first look)
    assert not run.interval(25 * MB, 0.44)
    assert run.interval(25 * MB, 0.56)  # 50% on average: leaves
    assert run.ctl.mode is Mode.RANGED
    # Neighbours: 45% on average stays; so does a pair with one calm interval
    # (a burst), whatever the other's wait.
    for waits in ((0.40, 0.50), (0.2, 0.79)):
        stays = Run(can_stream=True, base=4, max_width=32)
        assert not stays.interval(200 * MB, 0.0)
        for w in waits:
            assert not stays.interval(25 * MB, w)
        assert stays.ctl.mode is Mode.STREAM


def _beside(load: LoadProgress) -> tuple[Run, Callable[[float, float, float], bool]]:
    """Reader A (a :class:`Run`) and a sibling B of the same load; the function
    feeds one interval: B's rate (never waiting), then A's rate and wait."""
    a = Run(can_stream=True, base=4, max_width=32, load=load)
    b = Controller(can_stream=True, base=4, max_width=32, now=0.0, load=load)

    def both(rate_a: float, rate_b: float, waited_a: float) -> bool:
        b.observe(int(rate_b * INTERVAL), 0.0)
        return a.interval(rate_a, waited_a)

    return a, both


def test_a_stream_that_lags_its_load_leaves_at_the_first_starved_interval() -> None:
    """The first share of a many-tensor load over a bursting link kept its
    stream (24 MB/s, waiting 30-56% of each interval: never half the time
    twice in a row) while the other share read ahead at 500 MB/s; the load
    waited for it (2.0 s instead of 1.4 s). A stream that waits a quarter of
    the time while the load consumes four times its rate or more holds the
    load back: it goes to the ceiling at once."""
    load = LoadProgress()
    load.join()
    load.join()
    a, both = _beside(load)
    assert not both(200 * MB, 200 * MB, 0.0)  # (the first look: both keep up)
    assert both(24 * MB, 500 * MB, 0.42)  # A lags the load 21x and waited: wide at once
    assert (a.ctl.mode, a.ctl.width) == (Mode.RANGED, 32)
    assert "the load:" in a.ctl.reason
    # Neighbours: the same wait beside a sibling that is no faster keeps the stream
    # until it shows twice (a hiccup); and a lagging stream that never waits is
    # reader-bound: more connections would not help it.
    for rate_b, waited, leaves in ((24 * MB, 0.42, False), (500 * MB, 0.1, False)):
        load = LoadProgress()
        load.join()
        load.join()
        c, again = _beside(load)
        assert not again(200 * MB, 200 * MB, 0.0)
        assert again(24 * MB, rate_b, waited) is leaves
        assert c.ctl.mode is Mode.STREAM
    # Alone (no sibling), the stream's own rules hold: half the time, twice.
    alone = Run(can_stream=True, base=4, max_width=32)
    assert not alone.interval(200 * MB, 0.0)
    assert not alone.interval(24 * MB, 0.42)
    assert alone.ctl.mode is Mode.STREAM


def test_a_try_of_one_of_several_readers_is_judged_by_the_whole_load() -> None:
    """Two readers of one load on one link: reader A goes wide while B ramps
    up beside it and takes the server's attention. A's own rate falls (18
    MB/s), the load's rises: A keeps its connections (judged alone, it went
    back to one stream for the rest of its half of the file: a 2 s load
    instead of 1 s on the benchmark's bursting link)."""
    load = LoadProgress()
    load.join()
    load.join()
    a, both = _beside(load)
    assert both(123 * MB, 68 * MB, 0.9)  # A starved: wide
    assert (a.ctl.mode, a.ctl.width) == (Mode.RANGED, 32)
    assert not both(0, 100 * MB, 0.95)  # (the interval right after a change)
    assert not both(81 * MB, 445 * MB, 0.7)
    assert not both(18 * MB, 866 * MB, 0.97)  # A alone: worse; the load: 4.7x
    assert (a.ctl.mode, a.ctl.width) == (Mode.RANGED, 32)
    assert a.ctl.history[-1].reason == "kept"
    # One reader (or a reader whose siblings closed): judged by its own rate.
    alone = LoadProgress()
    alone.join()
    solo = Run(can_stream=True, base=4, max_width=32, load=alone)
    assert solo.interval(123 * MB, 0.9)
    solo.settle(0, 0.95)
    assert not solo.interval(81 * MB, 0.7)
    assert solo.interval(18 * MB, 0.97)
    assert solo.ctl.mode is Mode.STREAM and "did not beat" in solo.ctl.reason


def test_a_try_that_paid_for_its_reader_is_kept_when_the_load_looked_faster_before() -> None:
    """Two fetchers of one load: B went wide first and, when A tries, is
    emptying its read-ahead (the load's rate then is B's burst, 830 MB/s).
    A's own rate quadruples (88 -> 360 MB/s) while the load's falls back to
    what the link gives: A keeps its connections (judged by the load alone it
    went back to 4 and read the rest of its half at 100 MB/s). A try that
    paid for neither is still undone."""
    load = LoadProgress()
    load.join()
    load.join()
    a, both = _beside(load)
    assert both(88 * MB, 742 * MB, 0.87)  # A starved: wide; the load: 830 MB/s
    assert (a.ctl.mode, a.ctl.width) == (Mode.RANGED, 32)
    assert not both(0, 300 * MB, 0.9)  # (the interval right after a change)
    assert not both(360 * MB, 130 * MB, 0.44)  # A: 4x; the load: 490 MB/s
    assert (a.ctl.mode, a.ctl.width) == (Mode.RANGED, 32)
    assert a.ctl.history[-1].reason == "kept"
    # Neither A's rate nor the load's grew: undone, and the reason says both.
    c, again = _beside(load)
    assert again(88 * MB, 400 * MB, 0.87)
    again(0, 400 * MB, 0.9)
    assert not again(90 * MB, 400 * MB, 0.87)  # (one more chance to ramp up)
    assert again(90 * MB, 400 * MB, 0.87)
    assert c.ctl.mode is Mode.STREAM
    assert "did not beat 88 MB/s (the load: 490 against 488 MB/s)" in c.ctl.reason


def test_an_idle_first_interval_keeps_the_first_look_for_the_first_reads() -> None:
    """A fetcher read a header, then sat while its load was planned: that
    interval (little read, no wait) is no look at the link. The next one,
    starved 63% of the time on a paced link, gets the first look's rule
    (FIRST_SURE, not SURE twice in a row) and goes to the ceiling at once."""
    run = Run(can_stream=True, base=4, max_width=32)
    run.ctl.observe(IDLE_BYTES // 4, 0.0)
    run.now += 1.5 * INTERVAL
    assert not run.ctl.tick(run.now) and not run.ctl.history
    assert run.interval(25 * MB, 0.63)
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)
    # Without the idle interval before, a wait of 63% after the first look must show twice.
    later = Run(can_stream=True, base=4, max_width=32)
    assert not later.interval(200 * MB, 0.0)
    assert not later.interval(25 * MB, 0.63)
    assert later.interval(25 * MB, 0.63) and later.ctl.width < 32


def test_a_pause_between_reads_starts_the_first_look_again() -> None:
    """A fetcher read a load's header (1.4 MB: 3,805 tensors' metadata, so not
    an idle interval), then sat ~0.1 s while the load was planned. Its first
    look covered the pause (19% waited, as if the link kept up) and the stream
    stayed on a paced link for three more intervals. A read after a pause that
    is most of the look starts the look again: judged on the reads after it."""
    run = Run(can_stream=True, base=4, max_width=32)
    run.ctl.begin(0.0)
    run.ctl.observe(int(1.4 * MB), 0.02)  # the header: little waiting
    assert not run.ctl.tick(0.02)  # (too early to judge)
    run.ctl.begin(0.12)  # the first data read, after the planning
    span = FIRST_LOOK * 1.1
    run.ctl.observe(int(25 * MB * span), 0.9 * span)
    assert run.ctl.tick(0.12 + span)  # judged on its own span: starved at once
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)
    assert 20 * MB < run.ctl.last_rate < 30 * MB
    # Without the pause the same bytes are one look: not starved enough to leave.
    kept = Run(can_stream=True, base=4, max_width=32)
    kept.ctl.begin(0.0)
    kept.ctl.observe(int(1.4 * MB), 0.02)
    assert not kept.ctl.tick(0.02)
    kept.ctl.begin(0.03)  # a short gap (tensorizer parsing between reads)
    kept.ctl.observe(int(25 * MB * 0.1), 0.01)
    assert not kept.ctl.tick(0.13)
    assert kept.ctl.mode is Mode.STREAM
    assert abs(kept.ctl.last_rate - 3.9 * MB / 0.13) < 1  # the header's bytes counted too


def test_a_pause_after_the_first_look_is_the_reader_s_own_time() -> None:
    """After the first look a pause between reads is what the reader spends
    (the reader is the limit): it stays in the interval, never restarts it."""
    run = Run(can_stream=True, base=4, max_width=32)
    assert not run.interval(200 * MB, 0.0)  # the first look: the reader keeps up
    run.ctl.observe(int(5 * MB), 0.0)
    run.ctl.begin(run.now + 0.1)  # a long pause, then a read
    run.ctl.observe(int(5 * MB), 0.0)
    run.now += INTERVAL
    run.ctl.tick(run.now)
    assert run.ctl.last_rate == 10 * MB / INTERVAL  # both reads counted, over the whole span


def test_inside_a_ranged_read_a_try_is_not_undone_to_the_stream() -> None:
    """A read served by ranged requests cannot switch to the stream before it
    ends: undone there, a one-tensor load's rest went on at the base width."""
    run = Run(can_stream=True, base=4, max_width=32)
    assert run.interval(200 * MB, 0.9)
    assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)
    run.settle(0, 0.95)
    for _ in range(4):  # no gain, inside one read: the try stays
        run.ctl.observe(int(100 * MB * INTERVAL), 0.3 * INTERVAL)
        run.now += INTERVAL
        assert not run.ctl.tick(run.now, may_stream=False)
        assert (run.ctl.mode, run.ctl.width) == (Mode.RANGED, 32)
    assert not run.interval(100 * MB, 0.3)  # between reads: its second chance
    assert run.interval(100 * MB, 0.3)  # and undone
    assert run.ctl.mode is Mode.STREAM
