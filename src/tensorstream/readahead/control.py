"""The read-ahead controller: how wide a reader reads, decided all the time.

A reader's load is limited by one of three things, and which one can change
while it runs:

* **the reader** (its CPU: a fast link such as loopback or an object store
  next door): one streamed request received in place by the reader's own
  thread is cheapest (no copy, no thread hand-off, one request);
* **the link** (a per-connection cap, tens of milliseconds to first byte, a
  far-away store): only more requests in flight help, and the read-ahead
  they need is copied out when read (cheap next to the wait);
* **the server or the machine** (one server thread, a throttled account, a
  busy CPU): more requests only add work.

:class:`Controller` is fed, for each stretch of the load, the bytes the
reader consumed and how long it sat waiting for bytes that had not arrived.
Every ``interval`` it decides:

(the first interval starts at the reader's first read and closes after
``FIRST_LOOK`` when the reader waited most of it, ``FIRST_SURE``: a paced
link is recognised in tens of milliseconds; a stream's wait for its first
byte counts neither as waiting nor as time.)

* the reader *starved* (it waited for a good share of the interval): try
  more connections, as many more as the share it waited says the link
  needs (a stream becomes ranged read-ahead; see :meth:`Controller._wider`),
  and keep the change only if the delivered rate grew (``GAIN``, or half
  the step for a small step); otherwise go back and wait ``hold`` seconds
  (doubling after each failed try) before trying a smaller step. A stream
  leaves at once when it waited most of the time (``SURE``), else only after
  waiting half the time (``STREAM_STARVED``) twice in a row (a busy server
  or machine hiccups, a slow link does not), and never when each request's
  wait for its first byte is so long that even ``max_width`` ranged requests
  could not double the stream's rate (moto reads the whole object for each);
* the reader was the limit for ``CALM_INTERVALS`` intervals in a row while
  reading wide, and one connection (as the ranged requests' bodies measure
  it) delivers what the reader consumes: try the single in-place stream
  again (cheaper per byte; not within ``STREAM_RETRY`` of leaving it); go
  back if the rate fell;
* else keep what works.

A load read by several readers at once (tensorizer's parallel readers, the
fetcher threads of a remote load: one controller each) shares one link and
one server: one reader's rate falls when another's rises, and the load's
rate moves with the other readers' read-ahead. There a try is kept when it
paid either for the reader that made it or for the whole load
(:class:`LoadProgress`): judged by its own rate alone, a reader that went
wide while another ramped up beside it went back to one stream; judged by
the load's alone, a reader whose own rate quadrupled went back because the
other had just emptied its read-ahead.

So a link that starts slow and speeds up, slows, or bursts is followed, and
no judgement is final. The controller is pure logic (time comes in as an
argument), so its rules are tested without a network.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import threading

__all__ = ["Controller", "LoadProgress", "Mode", "Sample"]

log = logging.getLogger("tensorstream.readahead")
#: Below DEBUG: every measured interval is logged at this level.
TRACE = 5


class Mode(enum.Enum):
    """How a reader's bytes are fetched."""

    #: One request per run of sequential reads, received straight into the
    #: caller's buffers by the reader's own thread: no copy, no hand-off, one
    #: request. Best when the reader's CPU is the limit.
    STREAM = "stream"
    #: Ranged requests on a fixed grid of ``part_size`` pieces (independent of
    #: how the file is cut into tensors: small tensors share a request) kept in
    #: flight ahead of the reader on ``width`` connections, up to the
    #: ``readahead`` window; received into read-ahead buffers (copied out when
    #: read) or, for a piece a waiting read covers whole, straight into the
    #: caller's buffer. Best when the link is the limit.
    RANGED = "ranged"


#: Seconds of load per decision (and at least one decision per this much).
INTERVAL = 0.12
#: The load's first interval may close this early when the reader waited
#: most of it (``FIRST_SURE``): on a paced link a whole interval on one connection
#: is a fifth of a 256 MiB load; a reader that keeps up (loopback) never
#: waits that much, so it still gets its full first interval.
FIRST_LOOK = 0.04
#: The reader waited at least this share of an interval: it starved.
STARVED = 0.25
#: A stream that waited at least this share twice in a row is left.
STREAM_STARVED = 0.5
#: The reader waited at least this share: the link is surely the limit.
SURE = 0.8
#: ``SURE`` in the load's first interval. The first look underrates the wait
#: (a paced server's first chunk and the socket's buffer arrive at once, so
#: the reader's first pieces find bytes waiting), while a reader that keeps
#: up waits a small share from the start (docs/benchmarks.md, session 15).
FIRST_SURE = 0.6
#: The reader waited at most this share: the reader, not the link, was the limit.
CALM = 0.05
#: A first interval that consumed less than this without waiting was idle.
IDLE_BYTES = 1 << 20
#: Calm intervals in a row (while reading wide) before trying the stream again.
CALM_INTERVALS = 4
#: A wider try is kept when the delivered rate grew by this factor.
GAIN = 1.15
#: A narrower try (the stream) is kept unless the rate fell below this factor.
KEEP = 0.85
#: First and longest hold-off after a try that did not pay.
HOLD = 1.0
MAX_HOLD = 8.0
#: A request waiting this long for its first byte makes the first try from
#: the stream a small one.
SLOW_FIRST_BYTE = 0.1
#: Seconds after a stream starved before it is tried again.
STREAM_RETRY = 2.0
#: A stream is a load's laggard when the load (its other readers reading
#: ahead) consumed at least this many times its rate.
LAGGARD = 4.0


@dataclasses.dataclass(frozen=True)
class Sample:
    """One finished interval: what was measured and what was decided."""

    mode: Mode
    width: int
    rate: float  # bytes per second delivered to the reader
    waited: float  # share of the interval the reader waited for bytes
    reason: str


class LoadProgress:
    """The bytes consumed by every reader of one load, and how many read:
    shared by their controllers (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.consumed = 0
        self.readers = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.consumed += nbytes

    def join(self) -> None:
        with self._lock:
            self.readers += 1

    def leave(self) -> None:
        with self._lock:
            self.readers = max(0, self.readers - 1)


@dataclasses.dataclass
class _Try:
    mode: Mode
    width: int
    rate: float  # the reader's own rate before the try
    load_rate: float | None  # and the load's, while other readers read too
    wider: bool
    chances: int = 2  # intervals it may take to show the gain


class Controller:
    """Chooses a reader's :class:`Mode` and width from what it measures.

    ``can_stream``: the provider has range streams (else always ranged);
    ``base``: connections when a stream first goes wide (and the starting
    width without streams); ``max_width``: the ceiling (``concurrency``);
    ``load``: the progress of the load this reader is one of (while other
    readers read too, its tries are also judged by the load's rate).
    """

    def __init__(self, *, can_stream: bool, base: int, max_width: int, now: float,
                 fixed_width: int | None = None, name: str = "", part: int = 0,
                 load: LoadProgress | None = None) -> None:
        self.name = name  # what is read, for the log (redacted by the caller)
        self.part = part  # bytes of one ranged request (0: unknown)
        self.max_width = max(1, max_width)
        self.base = max(1, min(base, self.max_width))
        self.can_stream = can_stream
        self.fixed = fixed_width is not None
        self.mode = Mode.STREAM if can_stream else Mode.RANGED
        self.width = 1 if can_stream else (fixed_width or self.base)
        self.width = min(self.width, self.max_width)
        self.reason = "start: stream in place" if can_stream else "start: ranged read-ahead"
        self.changes = 0  # decisions that changed mode or width (statistics)
        self.last_rate = 0.0  # bytes/s delivered in the last interval (statistics)
        self.peak_rate = 0.0  # and the most in any interval
        self.history: list[Sample] = []  # the last decisions (statistics, bounded)
        self._start = now
        self._load = load
        self._load_mark = load.consumed if load is not None else 0
        self._first = True  # the load's first interval (it may close at FIRST_LOOK)
        self._sure = FIRST_SURE  # SURE for the interval being decided
        self._bytes = 0
        self._wait = 0.0
        self._dirty = False  # the interval saw bytes from before the last change
        self._trial: _Try | None = None
        self._hold_until = {True: 0.0, False: 0.0}  # wider / narrower tries
        self._hold = {True: HOLD, False: HOLD}
        self._calm = 0
        self._starved = 0  # starved intervals in a row
        self._last_waited: float | None = None  # the stream's last judged interval
        self._conn_rate: float | None = None  # what one ranged request's body delivers
        self._first_byte: float | None = None  # seconds a request waits for its first byte
        self._read_end: float | None = None  # the last tick: a read (or a piece of one) ended
        self._failed: int | None = None  # the width of the last wider try that did not pay

    # -- input -----------------------------------------------------------------------
    def observe(self, nbytes: int, waited: float, *, steady: bool = True) -> None:
        """The reader consumed ``nbytes`` and waited ``waited`` seconds for them;
        ``steady=False``: they came from read-ahead of an earlier mode (the
        interval then says nothing about the current one)."""
        self._bytes += nbytes
        self._wait += waited
        if self._load is not None:
            self._load.add(nbytes)
        if not steady:
            self._dirty = True

    def note_connection(self, rate: float) -> None:
        """One ranged request's body arrived at ``rate`` bytes/s (any thread)."""
        old = self._conn_rate
        self._conn_rate = rate if old is None else 0.8 * old + 0.2 * rate

    def begin(self, now: float) -> None:
        """A read starts. The load's first interval starts at the first one,
        not when the controller was made (opening the file and parsing its
        header were neither reading nor waiting for the link), and again at
        one that comes after the reader stopped reading for most of the
        first look: a fetcher that read a large header (the metadata of a
        model with thousands of tensors) and then sat while the load was
        planned measured its caller, not the link (docs/benchmarks.md,
        session 27)."""
        if not self._first:
            return
        if self._bytes == 0 and self._wait == 0.0:
            self._start = max(self._start, now)
        elif self._read_end is not None:
            pause = now - self._read_end
            if pause >= FIRST_LOOK and pause >= 0.5 * (now - self._start):
                self._start, self._bytes, self._wait, self._dirty = now, 0, 0.0, False

    def exclude(self, seconds: float) -> None:
        """``seconds`` of this interval were a stream's request waiting for its
        first byte: paid once per stream, neither the reader's work nor a
        sign that the link is the limit, so the interval closes as if they
        had not passed."""
        self._start += max(0.0, seconds)

    def note_first_byte(self, seconds: float) -> None:
        """A request waited ``seconds`` for its first byte (any thread)."""
        old = self._first_byte
        self._first_byte = seconds if old is None else 0.8 * old + 0.2 * seconds

    @property
    def connection_rate(self) -> float | None:
        return self._conn_rate

    def _ranged_can_pay(self, rate: float, waited: float) -> bool:
        """Whether ranged requests could beat a stream that delivers ``rate``
        while waiting ``waited`` of the time: each ``part`` costs a first byte
        (a far or busy server: moto reads the whole object per request) plus
        its transfer at the stream's link rate. If even ``max_width`` of them
        at once could not double the rate, the stream is the better way."""
        first = self._first_byte
        if first is None or self.part <= 0:
            return True
        link = rate / max(waited, 0.05)  # what the stream's connection delivered
        per_request = self.part / (first + self.part / max(link, 1.0))
        return per_request * self.max_width >= 2 * rate

    # -- decisions -----------------------------------------------------------------------
    def tick(self, now: float, *, may_stream: bool = True) -> bool:
        """Close the interval if it is due; return whether mode or width changed.
        ``may_stream=False``: the reader is inside a read that ranged requests
        serve (it cannot switch to the stream before the read ends): a change
        to the stream waits for a later interval."""
        span = now - self._start
        self._read_end = now
        if self.fixed:
            return False
        if span < INTERVAL and not (self._first and span >= FIRST_LOOK
                                    and self._wait >= FIRST_SURE * span):
            return False
        if self._first and self._bytes < IDLE_BYTES and self._wait < CALM * span:
            # The reader sat idle (its caller still planning or parsing after
            # the first read): that says nothing about the link, and the
            # first look is kept for when it reads.
            self._start, self._bytes, self._wait, self._dirty = now, 0, 0.0, False
            return False
        self._sure = FIRST_SURE if self._first else SURE
        self._first = False
        rate = self._bytes / span
        waited = min(1.0, self._wait / span)
        dirty = self._dirty
        self._start, self._bytes, self._wait, self._dirty = now, 0, 0.0, False
        load = self._load
        load_rate = None  # the load's rate while other readers read too
        if load is not None:
            consumed = load.consumed
            if load.readers > 1:
                load_rate = (consumed - self._load_mark) / span
            self._load_mark = consumed
        if dirty or rate <= 0:
            return False
        self.last_rate = rate
        self.peak_rate = max(self.peak_rate, rate)
        if log.isEnabledFor(TRACE):
            log.log(TRACE, "read-ahead of %s: %s x%d delivered %.0f MB/s, waited %.0f%%",
                    self.name, self.mode.value, self.width, rate / 1e6, waited * 100)
        return self._decide(now, rate, waited, load_rate, may_stream)

    def _decide(self, now: float, rate: float, waited: float, load_rate: float | None,
                may_stream: bool = True) -> bool:
        trial = self._trial
        if trial is not None:  # judge the last change
            # (A small wider step can only show a small gain: half of it will do.)
            factor = (min(GAIN, 1 + 0.5 * (self.width / max(trial.width, 1) - 1))
                      if trial.wider else KEEP)
            # Kept when it paid for the reader or for the load: with several
            # readers on one link and one CPU, one reader's rate falls when
            # another ramps up, and the load's rate moves with the other
            # readers' read-ahead (a share whose own rate quadrupled went
            # back when judged by the load alone).
            kept = rate >= trial.rate * factor or (
                trial.load_rate is not None and load_rate is not None
                and load_rate >= trial.load_rate * factor)
            if not kept and trial.mode is Mode.STREAM and not may_stream:
                return False  # judged again between reads
            if not kept and trial.chances > 1:
                # New connections may still be ramping up (connects, first
                # bytes, a busy server): one more interval before undoing.
                trial.chances -= 1
                return False
            self._trial = None
            if trial.wider:
                self._failed = None if kept else self.width
            if not kept:
                hold = self._hold[trial.wider]
                self._hold_until[trial.wider] = now + hold
                self._hold[trial.wider] = min(MAX_HOLD, hold * 2)
                why = f"back: {rate / 1e6:.0f} MB/s did not beat {trial.rate / 1e6:.0f} MB/s"
                if trial.load_rate is not None and load_rate is not None:
                    why += (f" (the load: {load_rate / 1e6:.0f} against "
                            f"{trial.load_rate / 1e6:.0f} MB/s)")
                return self._set(trial.mode, trial.width, rate, waited, why)
            self._hold[trial.wider] = HOLD
            if trial.wider and trial.mode is Mode.STREAM:
                # The stream just starved: try it again only once the link has
                # had time to change (a bursting link makes ranged bodies look
                # fast enough for a stream).
                self._hold_until[False] = now + STREAM_RETRY
            self._note(rate, waited, "kept")
            if not (trial.wider and waited >= STARVED):
                return False  # (a wider try that still starves widens further)
        # Leaving the stream costs copies: it takes a longer wait, twice in a
        # row unless most of the time (a busy server or machine hiccups; a
        # paced link does not). Not for a load's laggard: a stream that waits
        # while the load's other readers, reading ahead, consume many times its
        # rate holds the whole load back (it ends with its slowest share).
        stream = self.mode is Mode.STREAM
        lagging = stream and load_rate is not None and load_rate >= LAGGARD * rate
        # A stream's wait is an estimate (the share of each read that had not
        # arrived), noisy around half the time on a paced link: two intervals
        # that waited half the time on average are two starved ones.
        last = self._last_waited
        even = (stream and not lagging and last is not None and min(last, waited) >= STARVED
                and last + waited >= 2 * STREAM_STARVED)
        self._last_waited = waited if stream else None
        starved = STREAM_STARVED if stream and not lagging else STARVED
        if waited >= starved or even:
            self._calm = 0
            self._starved = max(self._starved + 1, 2) if even else self._starved + 1
            if now < self._hold_until[True]:
                return False
            if stream and not lagging and self._starved < self._patience(waited):
                return False
            if stream and not self._ranged_can_pay(rate, waited):
                return False
            mode, width = Mode.RANGED, self.max_width if lagging else self._wider(waited)
            if (mode, width) == (self.mode, self.width):
                return False
            self._trial = _Try(self.mode, self.width, rate, load_rate, wider=True)
            why = f"starved {waited:.0%} at {rate / 1e6:.0f} MB/s"
            if lagging and load_rate is not None:
                why += f" (the load: {load_rate / 1e6:.0f} MB/s)"
            return self._set(mode, width, rate, waited, why)
        self._starved = 0
        one = self._conn_rate
        # The stream is one connection: worth a try only if one delivers the rate.
        if (waited <= CALM and self.mode is Mode.RANGED and self.can_stream and may_stream
                and (one is None or one >= rate * KEEP)):
            self._calm += 1
            if self._calm >= CALM_INTERVALS and now >= self._hold_until[False]:
                self._calm = 0
                self._trial = _Try(self.mode, self.width, rate, load_rate, wider=False,
                                   chances=1)
                return self._set(Mode.STREAM, 1, rate, waited,
                                 f"reader-bound at {rate / 1e6:.0f} MB/s: try the stream")
        else:
            self._calm = 0
        return False

    def _patience(self, waited: float) -> int:
        """Starved intervals in a row before a stream is left: one when it
        waited most of the time, two when half, three whatever the wait when
        requests are slow to answer (a server doing much work per request, such
        as moto reading the whole object for each, serves a stream in bursts;
        a slow link starves it steadily)."""
        if self._first_byte is not None and self._first_byte >= SLOW_FIRST_BYTE:
            return 3
        return 1 if waited >= self._sure else 2

    def _wider(self, waited: float) -> int:
        """The width to try when the reader starved for ``waited`` of the time.

        Had it never waited it would have consumed ``1 / (1 - waited)`` times
        as much: that many times the connections (and a quarter more for
        requests' first bytes) is what the link needs if each connection adds
        its share. A reader that waited most of the time (``SURE``) goes to
        the ceiling at once instead of ramping up through the load's first
        second; a stream that waited 30% tries ``base``. After a try that did
        not pay, the next one goes half as far."""
        now = self.width if self.mode is Mode.RANGED else 1
        # Waiting most of the time says little about how much more the reader
        # could take (its own share is then mostly wake-ups and a busy
        # machine's run queue): go to the ceiling, the try will tell.
        slow_answers = self._first_byte is not None and self._first_byte >= SLOW_FIRST_BYTE
        want = (self.max_width if waited >= self._sure and not slow_answers
                else math.ceil(now * 1.25 / max(1.0 - waited, 0.02)))
        if slow_answers and self.mode is Mode.STREAM:
            # A server slow to answer each request may be doing a lot of work
            # per request (moto reads the whole object): try a few first.
            want = self.base
        low = self.base if self.mode is Mode.STREAM else now + max(1, now // 2)
        width = max(low, want)
        if self._failed is not None and self._failed > now:
            width = min(width, max(low if self.mode is Mode.STREAM else now + 1,
                                   (now + self._failed) // 2))
        return min(self.max_width, width)

    def _set(self, mode: Mode, width: int, rate: float, waited: float, reason: str) -> bool:
        changed = (mode, width) != (self.mode, self.width)
        self.mode, self.width, self.reason = mode, width, reason
        if changed:
            self.changes += 1
            self._dirty = True  # read-ahead of the old mode may still be consumed
        self._note(rate, waited, reason)
        log.debug("read-ahead of %s: %s x%d (%s)", self.name, mode.value, width, reason)
        return changed

    def _note(self, rate: float, waited: float, reason: str) -> None:
        self.history.append(Sample(self.mode, self.width, rate, waited, reason))
        del self.history[:-16]
