#!/usr/bin/env python3
"""Writes vectors.json: request sequences with their exact expected answers.

This is an independent oracle: it computes with exact fractions of tokens
(Python's Fraction) and whole microseconds, straight from the formulas of
docs/concepts.md (Algorithms; Reservations and debt), sharing no code with
any engine. Run it from this folder
after changing a case: python3 gen_vectors.py > vectors.json
"""
import hashlib
import json
import math
from datetime import datetime, timedelta, timezone as dt_timezone
from fractions import Fraction as F
from zoneinfo import ZoneInfo

S = 1_000_000  # microseconds per second; also micro-tokens per token
EXACT, WIDE = 2**52, 2**62  # the range every store counts exactly; Go's


def ceil(x):
    return math.ceil(x)


def tb_debt_bound(cap, r):
    """The most debt (micro-tokens) a token bucket's reservation may run up
    with max_reserved unset: (capacity + debt) * den stays below 2^52, or
    below 2^62 for a bucket already beyond 2^52 without debt."""
    den = r.denominator
    hi = EXACT if cap * den < EXACT else WIDE
    return max(0, (hi - 1) // den - cap)


def fw_debt_bound(cap, rate, period):
    """The same for a fixed window: capacity + debt stays below 2^52, and
    so does the wait to pay it, (ceil((capacity + debt)/rate) + 1) periods."""
    def most(hi):
        windows = (hi - 1) // period - 1
        return 0 if windows <= 0 else min(hi - 1, windows * rate)
    m = most(EXACT)
    if cap > m:
        m = most(WIDE)
    return max(0, m - cap)


class TokenBucket:
    def __init__(self, rate_per_us, cap, max_res):
        self.r, self.cap = rate_per_us, cap
        self.bound = tb_debt_bound(cap, rate_per_us)
        self.max_res = self.bound if max_res is None else min(max_res, self.bound)
        self.state = None

    def step(self, now, cost, reserve, max_res, take):
        if self.state is None:
            tokens, stamp = F(self.cap), now
        else:
            tokens, stamp = self.state
            if now > stamp:
                tokens = min(F(self.cap), tokens + (now - stamp) * self.r)
                stamp = now
        lag = stamp - now
        mr = self.max_res if max_res is None else min(max_res, self.bound)
        out = dict(allowed=False, retry_after_us=0)
        if tokens >= cost:
            out["allowed"] = True
            tokens -= cost
        elif reserve and cost - tokens <= mr:
            out["allowed"] = True
            tokens -= cost
            out["retry_after_us"] = lag + ceil(-tokens / self.r)
        else:
            need = cost - (mr if reserve else 0)
            out["retry_after_us"] = lag + ceil((need - tokens) / self.r)
        out["reset_after_us"] = lag + ceil((self.cap - tokens) / self.r) if tokens < self.cap else 0
        out["tokens"] = math.floor(tokens)
        if take and out["allowed"]:
            self.state = (tokens, stamp)
        return out


def tb_refund(self, now, amount):
    if self.state is None:
        return dict(allowed=True, retry_after_us=0, reset_after_us=0, tokens=math.floor(self.cap))
    tokens, stamp = self.state
    if now > stamp:
        tokens = min(F(self.cap), tokens + (now - stamp) * self.r)
        stamp = now
    tokens = min(F(self.cap), tokens + amount)
    self.state = (tokens, stamp)
    lag = stamp - now
    reset = lag + ceil((self.cap - tokens) / self.r) if tokens < self.cap else 0
    return dict(allowed=True, retry_after_us=0, reset_after_us=reset, tokens=math.floor(tokens))


TokenBucket.refund = tb_refund


class FixedWindow:
    def __init__(self, rate, period, cap, offset, key, max_res):
        self.rate, self.p, self.cap = rate, period, cap
        self.bound = fw_debt_bound(cap, rate, period)
        self.max_res = self.bound if max_res is None else min(max_res, self.bound)
        if offset is None:
            offset = int(hashlib.sha1(key.encode()).hexdigest()[:12], 16) % period
        self.offset = offset
        self.state = None

    def read(self):
        """The stored window as this limit counts it: a window written under
        another capacity (a reload) keeps what it used in it, the old
        capacity less its tokens, and has the new capacity less that left,
        at least zero; a debt stays (up to this limit's debt bound); a
        window of no known capacity (zero) keeps its tokens. A read does
        not store: only a write records this limit's capacity, so that a
        limit lowered and raised back before any write finds the count it
        had."""
        tokens, start, cap = self.state
        if cap != self.cap:
            if tokens < 0:
                tokens = max(tokens, -self.bound)
            elif cap <= 0:
                tokens = min(tokens, self.cap)
            else:
                used = cap - min(tokens, cap)
                tokens = max(0, self.cap - used)
        return tokens, start

    def step(self, now, cost, reserve, max_res, take):
        if self.state is None:
            tokens, start = self.cap, now - (now - self.offset) % self.p
        else:
            tokens, start = self.read()
            if now - start >= self.p:
                k = (now - start) // self.p
                start += k * self.p
                tokens = min(self.cap, tokens + k * self.rate)
        mr = self.max_res if max_res is None else min(max_res, self.bound)
        out = dict(allowed=False, retry_after_us=0)
        if tokens >= cost:
            out["allowed"] = True
            tokens -= cost
        elif reserve and cost - tokens <= mr:
            # Taken on credit: later windows pay the debt; the turn is
            # the boundary at which it is paid.
            out["allowed"] = True
            tokens -= cost
            out["retry_after_us"] = start + ceil(F(-tokens, self.rate)) * self.p - now
        else:
            need = cost - (mr if reserve else 0)
            out["retry_after_us"] = start + ceil(F(need - tokens, self.rate)) * self.p - now
        out["reset_after_us"] = start + ceil(F(self.cap - tokens, self.rate)) * self.p - now if tokens < self.cap else 0
        out["tokens"] = tokens
        if take and out["allowed"]:
            self.state = (tokens, start, self.cap)
        return out


def fw_refund(self, now, amount):
    if self.state is None:
        return dict(allowed=True, retry_after_us=0, reset_after_us=0, tokens=self.cap)
    tokens, start = self.read()
    if now - start >= self.p:
        k = (now - start) // self.p
        start += k * self.p
        tokens = min(self.cap, tokens + k * self.rate)
    tokens = min(self.cap, tokens + amount)
    self.state = (tokens, start, self.cap)
    reset = start + ceil(F(self.cap - tokens, self.rate)) * self.p - now if tokens < self.cap else 0
    return dict(allowed=True, retry_after_us=0, reset_after_us=reset, tokens=tokens)


FixedWindow.refund = fw_refund


class SlidingLog:
    def __init__(self, period, cap):
        self.p, self.cap, self.log = period, cap, []
        self.max_res = 0

    def step(self, now, cost, reserve, max_res, take):
        eff = max([now] + [s for s, _ in self.log])
        live = [(s, c) for s, c in self.log if s > eff - self.p]
        used = sum(c for _, c in live)
        out = dict(allowed=False, retry_after_us=0, reset_after_us=0)
        if used + cost <= self.cap:
            out["allowed"] = True
            used += cost
            if take:
                live.append((eff, cost))
                self.log = live
            out["reset_after_us"] = eff + self.p - now
        else:
            excess = used + cost - self.cap
            for s, c in live:
                excess -= c
                if excess <= 0:
                    out["retry_after_us"] = s + self.p - now
                    break
            if live:
                out["reset_after_us"] = live[-1][0] + self.p - now
        out["tokens"] = self.cap - used
        return out


def sl_refund(self, now, amount):
    eff = max([now] + [s for s, _ in self.log])
    live = [[s, c] for s, c in self.log if s > eff - self.p]
    while live and amount > 0:
        if live[-1][1] > amount:
            live[-1][1] -= amount
            amount = 0
        else:
            amount -= live[-1][1]
            live.pop()
    self.log = [(s, c) for s, c in live]
    used = sum(c for _, c in self.log)
    reset = self.log[-1][0] + self.p - now if self.log else 0
    return dict(allowed=True, retry_after_us=0, reset_after_us=reset, tokens=self.cap - used)


SlidingLog.refund = sl_refund


class Concurrency:
    """At most n leases live at once; a lease ends lease_us after it was
    taken or last renewed. Leases are named by the vectors' labels. An
    acquire (or its peek) may take a free slot; a release or a renew acts
    on the label's own live lease only."""
    def __init__(self, n, lease_us):
        self.n, self.lease, self.ends = n, lease_us, {}
        self.cap = n * S

    def step(self, now, op, label):
        live = {k: e for k, e in self.ends.items() if e > now}
        held = label is not None and label in live
        acquire = op in ("acquire", "peek")
        allowed = (held or len(live) < self.n) if acquire else held
        after = dict(live)
        if op == "release":
            after.pop(label, None)
        elif allowed:
            after[label] = max(after.get(label, 0), now + self.lease)
        out = dict(allowed=allowed, tokens=(self.n - len(after)) * S, retry_after_us=0,
                   reset_after_us=max([e - now for e in after.values()], default=0))
        if not allowed and acquire:
            # When enough leases have ended that one slot is free.
            out["retry_after_us"] = sorted(live.values())[len(live) - self.n] - now
        if op != "peek":
            self.ends = after
        return out


# Windows: uniform ones of period_us from the epoch, or calendar ones (day,
# week from Monday, month, year) from local midnight in an IANA zone, as
# Python's zoneinfo reckons local midnight (fold 0).
EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)


def to_us(dt):
    return (dt - EPOCH) // timedelta(microseconds=1)


def calendar_window(t, unit, tz):
    """[start, end) of the calendar window holding t (microseconds)."""
    z = ZoneInfo(tz)
    local = (EPOCH + timedelta(microseconds=t)).astimezone(z)
    d = local.date()
    if unit == "week":
        d = d - timedelta(days=d.weekday())
    elif unit == "month":
        d = d.replace(day=1)
    elif unit == "year":
        d = d.replace(month=1, day=1)
    if unit == "day":
        e = d + timedelta(days=1)
    elif unit == "week":
        e = d + timedelta(days=7)
    elif unit == "month":
        e = (d.replace(day=28) + timedelta(days=4)).replace(day=1)
    else:
        e = d.replace(year=d.year + 1)
    start = to_us(datetime(d.year, d.month, d.day, tzinfo=z))
    end = to_us(datetime(e.year, e.month, e.day, tzinfo=z))
    assert start <= t < end, (t, unit, tz)
    return start, end


def window_fn(limit):
    if "calendar" in limit:
        unit, tz = limit["calendar"], limit.get("timezone", "UTC")
        return lambda t: calendar_window(t, unit, tz)
    p = limit.get("period_us", S)
    return lambda t: (t - t % p, t - t % p + p)


def earliest(lo, hi, pred):
    """The least t in [lo, hi] with pred(t), for pred monotone (false then
    true) and pred(hi) true."""
    assert pred(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class SlidingWindow:
    """The two-window counter, computed from the list of admitted requests:
    at t, the window [s, e) holding t counts its own requests plus the
    previous window's weighted by (e - t)/(e - s), rounded up to a
    micro-token; a request is admitted if that plus its cost is within
    the capacity. Waits are found by search over t, not by formula."""
    def __init__(self, cap, window):
        self.cap, self.win, self.events = cap, window, []
        self.max_res = 0

    def used(self, t, events):
        s, e = self.win(t)
        ps, _ = self.win(s - 1)
        cur = sum(c for at, c in events if s <= at < e)
        prev = sum(c for at, c in events if ps <= at < s)
        return cur + ceil(F(prev * (e - t), e - s))

    def horizon(self, t):
        _, e = self.win(t)
        _, e2 = self.win(e)
        return e2

    def step(self, now, cost, reserve, max_res, take):
        used = self.used(now, self.events)
        out = dict(allowed=False, retry_after_us=0)
        after = self.events
        if used + cost <= self.cap:
            out["allowed"] = True
            used += cost
            after = self.events + [[now, cost]]
            if take:
                self.events = after
        else:
            ev = self.events
            out["retry_after_us"] = earliest(now, self.horizon(now), lambda t: self.used(t, ev) + cost <= self.cap) - now
        out["tokens"] = self.cap - used
        out["reset_after_us"] = earliest(now, self.horizon(now), lambda t: self.used(t, after) == 0) - now
        return out

    def refund(self, now, amount):
        if not self.events:
            return dict(allowed=True, retry_after_us=0, reset_after_us=0, tokens=self.cap)
        s, _ = self.win(now)
        ps, _ = self.win(s - 1)
        # newest first: this window's requests, then the previous window's
        for lo, hi in ((s, now + 1), (ps, s)):
            for ev in reversed(self.events):
                if lo <= ev[0] < hi and amount > 0:
                    back = min(amount, ev[1])
                    ev[1] -= back
                    amount -= back
        self.events = [ev for ev in self.events if ev[1] > 0 and ev[0] >= ps]
        ev = self.events
        return dict(allowed=True, retry_after_us=0, tokens=self.cap - self.used(now, ev),
                    reset_after_us=earliest(now, self.horizon(now), lambda t: self.used(t, ev) == 0) - now)


class CalendarWindow:
    """A fixed window on calendar boundaries: each window admits up to the
    capacity (never above the rate: nothing carries over); a rejection, and
    a window not full, wait for its end."""
    def __init__(self, cap, window):
        self.cap, self.win, self.events = cap, window, []
        self.max_res = 0

    def count(self, t):
        s, e = self.win(t)
        return sum(c for at, c in self.events if s <= at < e), e

    def step(self, now, cost, reserve, max_res, take):
        n, e = self.count(now)
        # A window that counted more than a lowered capacity has none
        # left; it holds no debt.
        n = min(n, self.cap)
        out = dict(allowed=False, retry_after_us=0)
        if n + cost <= self.cap:
            out["allowed"] = True
            n += cost
            if take:
                self.events.append([now, cost])
        else:
            out["retry_after_us"] = e - now
        out["tokens"] = self.cap - n
        out["reset_after_us"] = e - now if n > 0 else 0
        return out

    def refund(self, now, amount):
        s, e = self.win(now)
        # A refund is written: what a lowered capacity left uncounted goes
        # first (newest first), then amount.
        over = self.count(now)[0] - self.cap
        for ev in reversed(self.events):
            if s <= ev[0] and over > 0:
                back = min(over, ev[1])
                ev[1] -= back
                over -= back
        for ev in reversed(self.events):
            if s <= ev[0] and amount > 0:
                back = min(amount, ev[1])
                ev[1] -= back
                amount -= back
        n, e = self.count(now)
        return dict(allowed=True, retry_after_us=0, tokens=self.cap - n, reset_after_us=e - now if n > 0 else 0)


def engine(limit, key):
    alg = limit["algorithm"]
    if alg == "concurrency":
        return Concurrency(limit["max_in_flight"], limit.get("lease_us", 30 * S))
    if "tokens_per_second" in limit:
        rate, period = F(str(limit["tokens_per_second"])), S
        cap = F(str(limit.get("burst", limit["tokens_per_second"])))
    else:
        rate, period = F(str(limit["rate"])), limit.get("period_us", S)
        if "calendar" in limit:
            period = None
        cap = F(str(limit.get("capacity", limit["rate"] if alg != "leaky_bucket" else 1)))
    cap_u, rate_u = int(cap * S), int(rate * S)
    # max_reserved unset (or 0) reserves without bound: up to the range
    # every store counts exactly (the engines' debt bound).
    mr = limit.get("max_reserved")
    mr = None if not mr else int(F(str(mr)) * S)
    if alg in ("token_bucket", "leaky_bucket"):
        r = F(rate_u, period)
        if alg == "leaky_bucket":
            mr = math.floor(limit.get("max_delay_us", S) * r)
        return TokenBucket(r, cap_u, mr)
    if alg == "sliding_window":
        return SlidingWindow(cap_u, window_fn(limit))
    if alg == "fixed_window" and "calendar" in limit:
        return CalendarWindow(cap_u, window_fn(limit))
    if alg == "fixed_window":
        return FixedWindow(rate_u, period, cap_u, limit.get("start_us"), key, mr)
    return SlidingLog(period, cap_u)


def reload(old, limit, key):
    """The engine of limit (a reload of the same name), carrying old's
    state. A bucket keeps its tokens as an absolute amount, capped at the
    new capacity; one whose rate denominator changes keeps whole
    micro-tokens (the floor: stores keep tokens in units of 1/(1e6*den))
    and a debt of at most the new debt bound. A fixed window keeps its
    window and the capacity it was written under, and counts what it used
    in it against the new capacity (FixedWindow.read); calendar windows,
    logs and leases keep their requests as they are."""
    eng = engine(limit, key)
    if type(eng) is not type(old) or getattr(old, "state", True) is None:
        return eng
    if isinstance(eng, TokenBucket):
        tokens, stamp = old.state
        if eng.r.denominator != old.r.denominator:
            tokens = max(F(math.floor(tokens)), F(-eng.bound))
        eng.state = (min(tokens, F(eng.cap)), stamp)
    elif isinstance(eng, FixedWindow):
        eng.state = old.state
    elif isinstance(eng, SlidingLog):
        eng.log = list(old.log)
    elif isinstance(eng, (SlidingWindow, CalendarWindow)):
        eng.events = [list(ev) for ev in old.events]
    else:
        eng.ends = dict(old.ends)
    return eng


def run(case):
    eng = engine(case["limit"], case["key"])
    steps = []
    limit = case["limit"]
    for st in case["steps"]:
        op = st.get("op", "take")
        if "limit" in st:
            limit = st["limit"]
            eng = reload(eng, limit, case["key"])
        if op == "reset":
            eng = engine(limit, case["key"])
            steps.append(dict(st))
            continue
        if isinstance(eng, Concurrency):
            s = dict(st)
            if "want_error" not in st:
                out = eng.step(st["t_us"], op, st.get("lease"))
                out["remaining"] = max(0, out["tokens"] // S)
                s["want"] = {k: out[k] for k in ("allowed", "remaining", "tokens", "retry_after_us", "reset_after_us")}
            steps.append(s)
            continue
        cost = int(F(str(st.get("cost", 1))) * S)
        reserve = st.get("reserve", False) or limit["algorithm"] == "leaky_bucket" or limit.get("reserve", False)
        mr = st.get("max_reserved")
        mr = None if mr is None else int(F(str(mr)) * S)
        if reserve and op != "refund" and isinstance(eng, (SlidingWindow, CalendarWindow)):
            # A counter has no future turn to give, nor a calendar window
            # a debt to pay over windows of unequal lengths.
            if st.get("want_error") != "reserve_unsupported":
                raise SystemExit(f"{case['name']}: step {st}: a reservation here is reserve_unsupported")
            steps.append(dict(st))
            continue
        if op != "refund":
            # The most one request can ever be charged: the capacity, plus
            # the debt it may leave when it reserves. Above it: an error.
            most = eng.cap + ((eng.max_res if mr is None else min(mr, eng.bound)) if reserve else 0)
            never = cost > most
            if never != ("want_error" in st):
                raise SystemExit(f"{case['name']}: step {st}: cost {cost} vs most {most}: want_error is {'missing' if never else 'wrong'}")
        if "want_error" in st:
            steps.append(dict(st))
            continue
        if op == "refund":
            # A refund gives back at most the most one request can be
            # charged: the capacity plus the limit's debt bound.
            out = eng.refund(st["t_us"], min(cost, eng.cap + eng.max_res))
        else:
            out = eng.step(st["t_us"], cost, reserve, mr, op == "take")
        cap = eng.cap
        out["remaining"] = max(0, out["tokens"] // S) if out["tokens"] > 0 else 0
        s = dict(st)
        s["want"] = {k: out[k] for k in ("allowed", "remaining", "tokens", "retry_after_us", "reset_after_us")}
        steps.append(s)
    c = dict(case)
    c["steps"] = steps
    return c


def at(t_us, **kw):
    d = {"t_us": t_us}
    d.update(kw)
    return d


cases = []

# Seed 001's worked example with the refill during the burst counted.
steps = [at(k * S // 60) for k in range(60)]           # requests 1-60
steps += [at(S)]                                        # request 61 at t = 1 s
steps += [at(S + k * S // 60) for k in range(1, 61)]   # one second more: 1 in 6
steps += [at(7 * S, op="peek", cost=50), at(7 * S)]     # 5 s idle: full again
cases.append(dict(name="tb_seed_burst_refill_10rps_b50", key="client-a",
                  note="r=10/s, b=50, a request every 1/60 s: 1-59 pass, 60 waits 16667us, 61 at t=1s finds exactly 1 token, then 1 in 6",
                  limit=dict(algorithm="token_bucket", tokens_per_second=10, burst=50), steps=steps))

# Exact boundaries at a rate that is no whole number of micro-tokens per us.
cases.append(dict(name="tb_exact_boundary_7_per_3s", key="k",
                  note="7 tokens per 3 s: 1 token takes 428571.43us; a wait of 428572us finds exactly enough",
                  limit=dict(algorithm="token_bucket", rate=7, period_us=3 * S, capacity=2),
                  steps=[at(0, cost=2), at(0), at(428571), at(428572), at(428572), at(857143), at(857144)]))
cases.append(dict(name="tb_exact_boundary_one_per_10s", key="k",
                  limit=dict(algorithm="token_bucket", tokens_per_second=0.1, burst=1),
                  steps=[at(0), at(9_999_999), at(10 * S), at(20 * S - 1), at(20 * S)]))
cases.append(dict(name="tb_one_per_day", key="k",
                  limit=dict(algorithm="token_bucket", rate=1, period_us=86400 * S, capacity=1),
                  steps=[at(0), at(86400 * S - 1), at(86400 * S)]))
cases.append(dict(name="tb_billion_per_second", key="k",
                  limit=dict(algorithm="token_bucket", tokens_per_second=1e9, burst=1e9),
                  steps=[at(0, cost=1e9), at(0), at(1, cost=1000), at(1), at(2, cost=500.5), at(S, op="peek", cost=1e9)]))

# Reservations.
cases.append(dict(name="tb_reservation_debt", key="k",
                  note="3 tokens, cost 5 reserved: 2 tokens of debt due after 2/r; with max_reserved 1: rejected, unchanged",
                  limit=dict(algorithm="token_bucket", tokens_per_second=2, burst=10, max_reserved=4),
                  steps=[at(0, cost=7), at(0, cost=5, reserve=True, max_reserved=1), at(0, op="peek", cost=3),
                         at(0, cost=5, reserve=True), at(0, op="peek"), at(0, cost=1, reserve=True),
                         at(0, cost=2, reserve=True), at(S, op="peek"), at(1_500_000), at(5 * S, op="peek", cost=10)]))

# Fixed window against token bucket: the documented worst cases.
cases.append(dict(name="fw_never_more_than_capacity", key="k",
                  limit=dict(algorithm="fixed_window", rate=10, period_us=S, capacity=10, start_us=0),
                  steps=[at(999_999, cost=10), at(S, cost=10), at(S), at(1_500_000, op="peek"), at(2 * S - 1), at(2 * S, cost=10), at(2 * S)]))
cases.append(dict(name="tb_capacity_plus_rate_in_one_period", key="k",
                  note="the token bucket's worst case: capacity + rate within one period (20 in [0s,1s])",
                  limit=dict(algorithm="token_bucket", tokens_per_second=10, burst=10),
                  steps=[at(0, cost=10), at(S, cost=10), at(S)]))
cases.append(dict(name="fw_rollover_up_to_capacity", key="k",
                  limit=dict(algorithm="fixed_window", rate=10, period_us=S, capacity=25, start_us=250_000),
                  steps=[at(300_000, cost=25), at(400_000), at(1_250_000, cost=10), at(1_250_000),
                         at(5_000_000, cost=25), at(5_000_000), at(5_100_000, cost=0.5, op="peek")]))
cases.append(dict(name="fw_hashed_offset", key="user-42",
                  limit=dict(algorithm="fixed_window", rate=100, period_us=60 * S),
                  steps=[at(1_700_000_000 * S, cost=100), at(1_700_000_000 * S), at(1_700_000_060 * S), at(1_700_000_060 * S, cost=99)]))

# Sliding log: exactly N in any window.
cases.append(dict(name="sl_exact_count", key="k",
                  limit=dict(algorithm="sliding_log", rate=3, period_us=S),
                  steps=[at(0), at(100_000), at(200_000), at(300_000), at(999_999), at(S), at(S), at(1_100_000), at(1_200_000, cost=2), at(2_200_000, cost=3)]))

# Leaky bucket: one slot every 1/r, up to the maximum delay.
cases.append(dict(name="lb_shaping_slots", key="k",
                  limit=dict(algorithm="leaky_bucket", rate=10, period_us=S, max_delay_us=500_000),
                  steps=[at(0)] * 7 + [at(0), at(50_000), at(100_000)]))

# Variable and fractional cost.
cases.append(dict(name="tb_weighted_and_fractional", key="k",
                  limit=dict(algorithm="token_bucket", tokens_per_second=10, burst=10),
                  steps=[at(0, cost=5), at(0, cost=0.5), at(0, cost=4.5), at(0, cost=0.5), at(50_000, cost=0.5),
                         at(50_000, cost=11, want_error="cost_exceeds_limit")]))

# A clock that steps back adds nothing.
cases.append(dict(name="tb_clock_steps_back", key="k",
                  limit=dict(algorithm="token_bucket", tokens_per_second=1, burst=2),
                  steps=[at(10 * S, cost=2), at(5 * S), at(10 * S), at(11 * S)]))

# Peek consumes nothing; reset refills.
cases.append(dict(name="tb_peek_and_reset", key="k",
                  limit=dict(algorithm="token_bucket", tokens_per_second=1, burst=3),
                  steps=[at(0, op="peek"), at(0, op="peek"), at(0, cost=3), at(0, op="peek"), at(0, op="reset"), at(0, cost=3)]))

# Refunds (Envoy's negative hits): back up to the capacity, never above.
cases.append(dict(name="tb_refund", key="k",
                  limit=dict(algorithm="token_bucket", tokens_per_second=1, burst=10, max_reserved=5),
                  steps=[at(0, op="refund", cost=3), at(0, op="peek", cost=10), at(0, cost=8), at(0, op="refund", cost=3),
                         at(500_000, op="refund", cost=9), at(500_000, cost=10), at(500_000, cost=4, reserve=True),
                         at(500_000, op="refund", cost=1.5), at(600_000, op="peek")]))
cases.append(dict(name="fw_refund", key="k",
                  limit=dict(algorithm="fixed_window", rate=10, period_us=S, capacity=15, start_us=0),
                  steps=[at(500_000, cost=15), at(600_000, op="refund", cost=4), at(600_000, cost=5), at(700_000, op="refund", cost=15),
                         at(1_200_000, op="peek", cost=15), at(1_200_000, cost=15), at(3_000_000, op="refund", cost=1)]))
cases.append(dict(name="sl_refund", key="k",
                  limit=dict(algorithm="sliding_log", rate=3, period_us=S),
                  steps=[at(0, op="refund"), at(0), at(100_000, cost=2), at(150_000), at(200_000, op="refund"), at(300_000),
                         at(400_000), at(450_000, op="refund", cost=2.5), at(500_000, cost=2.5), at(1_200_000, op="refund", cost=3), at(1_200_000, cost=3)]))

# A refund above what one request can be charged (the capacity plus the
# debt a reservation may leave) is a refund of that: a bucket that is not
# in debt is full again, and one in debt is paid back, up to full.
cases.append(dict(name="tb_refund_above_capacity", key="k",
                  note="burst 10, max_reserved 5: refunds of 25 and of 1e12 tokens (beyond what a store can count) refill to 10; from 4 tokens of debt, a refund of 11 (one request can be charged up to 15) gives back 11",
                  limit=dict(algorithm="token_bucket", tokens_per_second=1, burst=10, max_reserved=5),
                  steps=[at(0, cost=8), at(0, op="refund", cost=25), at(0, op="peek", cost=10), at(0, cost=10), at(0, op="refund", cost=1e12),
                         at(0, cost=10), at(0, cost=4, reserve=True), at(0, op="refund", cost=11), at(100_000, op="peek")]))
cases.append(dict(name="fw_refund_above_capacity", key="k",
                  limit=dict(algorithm="fixed_window", rate=10, period_us=S, capacity=15, start_us=0),
                  steps=[at(500_000, cost=15), at(600_000, op="refund", cost=40), at(600_000, cost=15), at(700_000, op="refund", cost=1e12), at(700_000, op="peek", cost=15)]))
cases.append(dict(name="sl_refund_above_capacity", key="k",
                  limit=dict(algorithm="sliding_log", rate=3, period_us=S),
                  steps=[at(0), at(100_000, cost=2), at(200_000, op="refund", cost=10), at(200_000, cost=3), at(300_000, op="refund", cost=1e12), at(300_000, op="peek", cost=3)]))
cases.append(dict(name="lb_refund_above_capacity", key="k",
                  note="capacity 1, max_delay 0.5s (5 slots of debt): two requests leave one slot of debt; a refund of 5 gives back 2, clearing the debt and filling the bucket",
                  limit=dict(algorithm="leaky_bucket", rate=10, period_us=S, max_delay_us=500_000),
                  steps=[at(0), at(0), at(0, op="refund", cost=5), at(0, op="peek"), at(0, op="refund", cost=5), at(0, op="peek")]))

# Reservations as seed 003 (Convex) defines them, with its worked numbers
# and its component tests (get-convex/rate-limiter, src/component/
# lib.test.ts: "retryAfter is accurate", "retryAfter for reserved is
# accurate", "reserved without max", "reserved with max", "consume too
# much reserved"). max_reserved unset reserves without bound.
M = 60 * S
cases.append(dict(name="tb_convex_take_after_6s", key="k",
                  note="10/min, capacity 10: take 5; 6 s later 1 more has arrived: take 6 leaves 0; take 10 waits a minute",
                  limit=dict(algorithm="token_bucket", rate=10, period_us=M),
                  steps=[at(0, cost=5), at(6 * S, cost=6), at(6 * S, cost=10)]))
cases.append(dict(name="tb_convex_reserve_above_capacity", key="k",
                  note="10/min, capacity 10: take 5; 6 s later reserve 16 (above the capacity): value -10, turn in a minute; 30 s later reserve 5: -10 again, a minute",
                  limit=dict(algorithm="token_bucket", rate=10, period_us=M),
                  steps=[at(0, cost=5), at(6 * S, cost=16, reserve=True), at(6 * S, op="peek"),
                         at(36 * S, cost=5, reserve=True), at(96 * S, op="peek")]))
cases.append(dict(name="fw_convex_take_next_window", key="k",
                  note="10/min windows from 0: take 5; in the next window take 6 leaves 4; take 10 waits for the window after",
                  limit=dict(algorithm="fixed_window", rate=10, period_us=M, start_us=0),
                  steps=[at(0, cost=5), at(M, cost=6), at(M, cost=10)]))
cases.append(dict(name="fw_convex_reserve_carries", key="k",
                  note="10/min windows from 0: take 5; next window reserve 16: -6, turn in a minute; 30 s later reserve 5: -11, turn in 90 s; the windows after pay the debt first",
                  limit=dict(algorithm="fixed_window", rate=10, period_us=M, start_us=0),
                  steps=[at(0, cost=5), at(M, cost=16, reserve=True), at(M + 30 * S, cost=5, reserve=True),
                         at(2 * M, op="peek"), at(2 * M, op="peek", cost=1, reserve=True), at(3 * M, op="peek"), at(3 * M, cost=9)]))
for alg in ("token_bucket", "fixed_window"):
    short = alg[0] + alg.split("_")[1][0]
    start = dict(start_us=0) if alg == "fixed_window" else {}
    cases.append(dict(name=f"{short}_convex_reserved_without_max", key="k",
                      note="1/hour, no max_reserved: reserving 100 is admitted with a turn 99 hours ahead; a plain take then waits longer",
                      limit=dict(algorithm=alg, rate=1, period_us=3600 * S, **start),
                      steps=[at(0, op="peek"), at(0, cost=100, reserve=True), at(0, op="peek"), at(0, op="peek", cost=1, reserve=True)]))
    cases.append(dict(name=f"{short}_convex_reserved_with_max", key="k",
                      note="1/hour, max_reserved 1: 2 may be reserved (1 in debt), then nothing more until the debt is paid",
                      limit=dict(algorithm=alg, rate=1, period_us=3600 * S, max_reserved=1, **start),
                      steps=[at(0, op="peek", cost=2, reserve=True), at(0, cost=2, reserve=True), at(0, op="peek"),
                             at(0, cost=1, reserve=True), at(3600 * S, cost=1, reserve=True)]))
    cases.append(dict(name=f"{short}_convex_consume_too_much_reserved", key="k",
                      note="1/s, max_reserved 2: a reservation of 4 exceeds 3 and can never succeed; 3 can; a plain take of 2 exceeds 1",
                      limit=dict(algorithm=alg, rate=1, period_us=S, max_reserved=2, **start),
                      steps=[at(0, cost=4, reserve=True, want_error="cost_exceeds_limit"), at(0, cost=2, want_error="cost_exceeds_limit"),
                             at(0, op="peek", cost=4, reserve=True, want_error="cost_exceeds_limit"),
                             at(0, cost=3, reserve=True), at(0, cost=0.5, reserve=True), at(2 * S, cost=2, reserve=True)]))
for lim in (dict(algorithm="token_bucket", rate=10, period_us=M), dict(algorithm="fixed_window", rate=10, period_us=M, start_us=0)):
    short = "tb" if lim["algorithm"] == "token_bucket" else "fw"
    cases.append(dict(name=f"{short}_refund_reservation_above_capacity", key="k",
                      note="10/min, capacity 10: a reservation of 16 given back restores the 16, not only the capacity; a larger refund fills the bucket",
                      limit=lim,
                      steps=[at(0, cost=5), at(6 * S, cost=16, reserve=True), at(6 * S, op="refund", cost=16), at(6 * S, op="peek"),
                             at(6 * S, cost=16, reserve=True), at(6 * S, op="refund", cost=1e12), at(6 * S, op="peek", cost=10)]))

# Capacity 0 with reserve: nothing is ever held, every request waits its
# turn, exactly cost/rate after the one before (seed 003's perfect spacing).
cases.append(dict(name="tb_capacity_zero_spacing", key="k",
                  note="10/s, capacity 0, every request reserves: turns at 100, 200, 300 ms; one at 250 ms gets 400 ms; a cost of 2 at 1 s waits 200 ms",
                  limit=dict(algorithm="token_bucket", rate=10, period_us=S, capacity=0, reserve=True),
                  steps=[at(0, op="peek"), at(0), at(0), at(0), at(250_000), at(S, cost=2), at(S, op="refund", cost=1), at(S, op="peek")]))
cases.append(dict(name="fw_capacity_zero_spacing", key="k",
                  note="10/min windows, capacity 0, every request reserves: each waits for the window whose tokens pay it",
                  limit=dict(algorithm="fixed_window", rate=10, period_us=M, capacity=0, reserve=True, start_us=0),
                  steps=[at(0), at(0, cost=10), at(M), at(3 * M, op="peek")]))

# max_reserved unset is bounded only by what every store counts exactly:
# (capacity + debt) * den < 2^52. A rate of 1 per 999999999 us has
# den = 999999999, so a bucket of 1 may go 3.503599 tokens into debt.
cases.append(dict(name="tb_unbounded_reserve_range", key="k",
                  note="1 per 999999999us, capacity 1, no max_reserved: the debt may reach 3.503599 tokens ((1+3.503599)e6 * 999999999 < 2^52); one micro-token more never can",
                  limit=dict(algorithm="token_bucket", rate=1, period_us=999_999_999, capacity=1),
                  steps=[at(0, cost=4.5036, reserve=True, want_error="cost_exceeds_limit"), at(0, cost=4.503599, reserve=True),
                         at(0, op="peek", cost=0.000001, reserve=True), at(0, op="refund", cost=1e12), at(0, cost=4.503599, reserve=True, max_reserved=1e6)]))
cases.append(dict(name="tb_unbounded_reserve_range_at_2p52", key="k",
                  note="1e9/s, burst 1e9 (den 1): the debt may reach 2^52 - 1 - 1e15 micro-tokens = 3503599627.370495 tokens, the edge of what Lua's doubles hold exactly",
                  limit=dict(algorithm="token_bucket", tokens_per_second=1e9, burst=1e9),
                  steps=[at(0, cost=5e9, reserve=True, want_error="cost_exceeds_limit"), at(0, cost=3e9, reserve=True), at(0, cost=1.5e9, reserve=True),
                         at(0, op="peek", cost=3599627.370496, reserve=True), at(0, cost=3599627.370495, reserve=True),
                         at(0, op="peek", cost=0.000001, reserve=True), at(1, op="peek", cost=0.001, reserve=True), at(S, op="refund", cost=1e12)]))
cases.append(dict(name="fw_unbounded_reserve_range", key="k",
                  note="1 per 2^50us window, capacity 1, no max_reserved: paying a debt must end within 2^52us, so 1 token of debt at most",
                  limit=dict(algorithm="fixed_window", rate=1, period_us=2**50, capacity=1, start_us=0),
                  steps=[at(0, cost=2.000001, reserve=True, want_error="cost_exceeds_limit"), at(0, cost=2, reserve=True), at(0, op="peek", cost=0.5, reserve=True)]))

# Reloads: a step with "limit" replaces the case's limit, under the same
# name, from that step on. The key's state is carried over (see reload):
# a bucket's tokens absolute, capped at the new capacity, never refilled
# by a raise; a fixed window's count of what it used.
PU30 = dict(algorithm="token_bucket", rate=30, period_us=M)
PU20 = dict(algorithm="token_bucket", rate=20, period_us=M)
cases.append(dict(name="tb_reload_keeps_drained", key="user-1",
                  note="per-user 30/min drained, reloaded as 20/min (another rate denominator): still drained, refilling at the new rate; reloaded back to 30/min: the same bucket, not an older one",
                  limit=PU30,
                  steps=[at(0, cost=30), at(0, op="peek"), at(S, op="peek", limit=PU20), at(S),
                         at(3 * S), at(3 * S, op="peek", limit=PU30), at(4 * S), at(5 * S, op="peek", cost=2),
                         at(6 * S, op="peek", limit=PU20)]))
cases.append(dict(name="tb_reload_capacity_capped_not_refilled", key="k",
                  note="30/min at 25 of 30, burst lowered to 20: 20 of 20; raised to 40: still what it held, refilling at the rate",
                  limit=PU30,
                  steps=[at(0, cost=5), at(0, op="peek", limit=dict(PU30, capacity=20)), at(0, cost=20), at(0, op="peek"),
                         at(0, op="peek", limit=dict(PU30, capacity=40)), at(2 * S, op="peek"), at(2 * S, cost=2), at(2 * S)]))
cases.append(dict(name="tb_reload_fraction_floored", key="k",
                  note="7 per 3 s (den 3) holding 1.1333333... tokens, reloaded as 10/s (den 1): 1.133333 tokens, the floor to a micro-token; reloaded back, the refill of 1us is 7/3 micro-tokens again",
                  limit=dict(algorithm="token_bucket", rate=7, period_us=3 * S, capacity=2),
                  steps=[at(0), at(100_000, cost=0.1), at(100_000, op="peek", cost=1.133334, limit=dict(algorithm="token_bucket", tokens_per_second=10, burst=2)),
                         at(100_000, cost=1.133333), at(100_000, op="peek", cost=0.000001),
                         at(100_001, op="peek", cost=0.000002, limit=dict(algorithm="token_bucket", rate=7, period_us=3 * S, capacity=2)),
                         at(100_001, op="peek", cost=0.000003)]))
cases.append(dict(name="tb_reload_debt_kept", key="k",
                  note="2/s, burst 10, 6 tokens of reserved debt; reloaded as 1 per 3 s: the debt stays, paid at the new rate",
                  limit=dict(algorithm="token_bucket", tokens_per_second=2, burst=10, max_reserved=10),
                  steps=[at(0, cost=10), at(0, cost=6, reserve=True), at(0, op="peek"),
                         at(S, op="peek", limit=dict(algorithm="token_bucket", rate=1, period_us=3 * S, capacity=10, max_reserved=10)),
                         at(S, cost=1, reserve=True), at(30 * S, op="peek")]))
cases.append(dict(name="tb_reload_debt_beyond_new_range", key="k",
                  note="1e9/s (den 1) 2e9 tokens in debt, reloaded as 1 per 999999999us, capacity 1: the debt is kept up to what every store counts exactly under the new rate, 3.503599 tokens",
                  limit=dict(algorithm="token_bucket", tokens_per_second=1e9, burst=1e9),
                  steps=[at(0, cost=3e9, reserve=True), at(0, op="peek", limit=dict(algorithm="token_bucket", rate=1, period_us=999_999_999, capacity=1)),
                         at(S, op="peek")]))
cases.append(dict(name="lb_reload_queue_kept", key="k",
                  note="leaky 10/s, 0.5 s of queue: five turns reserved; reloaded as 4 per 3 s with 6 s of queue: the next turn comes after the queued ones, at the new spacing",
                  limit=dict(algorithm="leaky_bucket", rate=10, period_us=S, max_delay_us=500_000),
                  steps=[at(0)] * 5 + [at(0, limit=dict(algorithm="leaky_bucket", rate=4, period_us=3 * S, max_delay_us=6 * S)), at(0), at(100_000, op="peek")]))
FW3 = dict(algorithm="fixed_window", rate=3, period_us=M, start_us=0)
cases.append(dict(name="fw_reload_window_kept", key="k",
                  note="3/min used up, raised to 5/min: 2 more in the window (one taken); the next window brings 5; lowered to 2 with 1 of 5 used: 1 left; a shorter period counts its windows from the one in use",
                  limit=FW3,
                  steps=[at(0, cost=3), at(10 * S, limit=dict(FW3, rate=5)), at(M), at(M, op="peek"),
                         at(M + S, op="peek", limit=dict(FW3, rate=2)), at(M + S, cost=2), at(M + S),
                         at(M + 25 * S, op="peek", limit=dict(FW3, rate=2, period_us=10 * S)), at(M + 35 * S, op="peek")]))
FW5 = dict(FW3, rate=5)
cases.append(dict(name="fw_reload_raise_admits_difference", key="k",
                  note="3/min used up, raised to 5/min 10 s into the window: exactly 2 more in it, then nothing until the next window, which brings 5",
                  limit=FW3,
                  steps=[at(0, cost=3), at(S), at(10 * S, op="peek", limit=FW5), at(10 * S), at(20 * S), at(30 * S),
                         at(59 * S, op="peek"), at(M, op="peek", cost=5), at(M, cost=5), at(M)]))
cases.append(dict(name="fw_reload_lower_admits_none", key="k",
                  note="5/min with 3 used, lowered to 2/min: none more in the window (never below zero); raised back to 5 before any write: the 2 left of the 3 used; lowered to 4: 1 more; the next window brings 4",
                  limit=FW5,
                  steps=[at(0, cost=3), at(S, limit=dict(FW3, rate=2)), at(2 * S, op="peek"),
                         at(4 * S, op="peek", limit=FW5), at(5 * S, op="peek", cost=2),
                         at(6 * S, limit=dict(FW3, rate=4)), at(7 * S), at(7 * S, op="peek"),
                         at(M, op="peek", cost=4), at(M, cost=4), at(M)]))
cases.append(dict(name="fw_reload_lower_then_refund", key="k",
                  note="5/min with 4 used, lowered to 2/min: none left; a refund of 1 is written under the new limit, from none: 1 left (1 used), and raised back to 5 that count stays: 4 left",
                  limit=FW5,
                  steps=[at(0, cost=4), at(S, op="peek", limit=dict(FW3, rate=2)), at(2 * S, op="refund", cost=1),
                         at(3 * S, op="peek"), at(4 * S, op="peek", cost=3, limit=FW5), at(5 * S, cost=3), at(6 * S)]))
cases.append(dict(name="fw_reload_across_boundary", key="k",
                  note="3/min used up in the window [0, 1min), raised to 5/min in the next: that window starts from 5; 2/min used up, lowered to 1 at the boundary: 1",
                  limit=FW3,
                  steps=[at(0, cost=3), at(M + S, op="peek", cost=5, limit=FW5), at(M + S, cost=5), at(M + 2 * S),
                         at(2 * M, cost=2, limit=dict(FW3, rate=2)), at(3 * M, op="peek", limit=dict(FW3, rate=1)),
                         at(3 * M), at(3 * M)]))
cases.append(dict(name="fw_reload_debt_kept", key="k",
                  note="3/min used up and 2 reserved (a debt of 2): raised to 5/min the debt stays, nothing left in the window, the next window pays it and leaves 3; lowered to 2 with a debt of 1: still 1 owed, the next window leaves 1",
                  limit=dict(FW3, max_reserved=5),
                  steps=[at(0, cost=3), at(0, cost=2, reserve=True), at(S, op="peek", limit=dict(FW5, max_reserved=5)),
                         at(2 * S), at(M, op="peek", cost=3), at(M, op="peek", cost=4),
                         at(M, cost=4, reserve=True), at(M + S, op="peek", limit=dict(FW3, rate=2, max_reserved=5)),
                         at(2 * M, op="peek"), at(2 * M), at(2 * M)]))
cases.append(dict(name="sl_reload_log_kept", key="k",
                  note="5/min with 4 in the log, lowered to 3/min: rejected until entries leave the window; raised to 10/min: 6 more",
                  limit=dict(algorithm="sliding_log", rate=5, period_us=M),
                  steps=[at(0), at(S), at(2 * S), at(3 * S), at(4 * S, limit=dict(algorithm="sliding_log", rate=3, period_us=M)),
                         at(4 * S, op="peek", cost=6, limit=dict(algorithm="sliding_log", rate=10, period_us=M)), at(4 * S, cost=6)]))
cases.append(dict(name="cc_reload_leases_kept", key="k",
                  note="2 slots both held, lowered to 1: no new slot until both ends; raised to 3: one",
                  limit=dict(algorithm="concurrency", max_in_flight=2, lease_us=10 * S),
                  steps=[at(0, op="acquire", lease="a"), at(0, op="acquire", lease="b"),
                         at(S, op="acquire", lease="c", limit=dict(algorithm="concurrency", max_in_flight=1, lease_us=10 * S)),
                         at(S, op="release", lease="a"), at(S, op="acquire", lease="c"),
                         at(S, op="acquire", lease="c", limit=dict(algorithm="concurrency", max_in_flight=3, lease_us=10 * S))]))

# Concurrency limits: each step names its lease ("lease": a label the
# harness maps to a random lease id); peeks without one ask for a new slot.
cases.append(dict(name="cc_acquire_release", key="k",
                  note="2 slots, 10 s leases: a third acquire waits for the first lease to end (retry = its end); a release frees a slot at once; releasing twice finds nothing",
                  limit=dict(algorithm="concurrency", max_in_flight=2, lease_us=10 * S),
                  steps=[at(0, op="peek"), at(0, op="acquire", lease="a"), at(S, op="acquire", lease="b"),
                         at(2 * S, op="acquire", lease="c"), at(2 * S, op="peek"),
                         at(3 * S, op="release", lease="a"), at(3 * S, op="release", lease="a"),
                         at(3 * S, op="acquire", lease="c"), at(4 * S, op="acquire", lease="d"),
                         at(4 * S, op="take", want_error="lease_required")]))
cases.append(dict(name="cc_lease_expiry", key="k",
                  note="1 slot, 1 s lease: the holder never releases; its slot is free exactly when its lease ends, and its late release finds nothing",
                  limit=dict(algorithm="concurrency", max_in_flight=1, lease_us=S),
                  steps=[at(0, op="acquire", lease="a"), at(S - 1, op="acquire", lease="b"), at(S - 1, op="peek"),
                         at(S, op="peek"), at(S, op="acquire", lease="b"), at(S + 1, op="release", lease="a"),
                         at(S + 1, op="peek", lease="b")]))
cases.append(dict(name="cc_renew", key="k",
                  note="1 slot, 1 s lease: acquiring again with the same lease renews it from now, never shortening it; a lease that lapsed is taken again if a slot is free",
                  limit=dict(algorithm="concurrency", max_in_flight=1, lease_us=S),
                  steps=[at(0, op="acquire", lease="a"), at(900_000, op="acquire", lease="a"), at(1_500_000, op="acquire", lease="b"),
                         at(1_899_999, op="peek", lease="a"), at(1_900_000, op="acquire", lease="b"),
                         at(3_000_000, op="acquire", lease="b"), at(3_000_000, op="acquire", lease="a"),
                         at(3_000_000, op="reset"), at(3_000_000, op="acquire", lease="a")]))
cases.append(dict(name="cc_renew_only", key="k",
                  note="2 slots, 1 s lease: renew extends a live lease to now + lease and takes no slot: a lease never acquired, one that lapsed and one released are refused and add nothing, even with a slot free",
                  limit=dict(algorithm="concurrency", max_in_flight=2, lease_us=S),
                  steps=[at(0, op="renew", lease="x"), at(0, op="peek"), at(0, op="acquire", lease="a"),
                         at(600_000, op="renew", lease="a"), at(700_000, op="acquire", lease="b"),
                         at(800_000, op="renew", lease="a"), at(1_500_000, op="renew", lease="b"),
                         at(1_700_000, op="peek"), at(1_900_000, op="renew", lease="a"),
                         at(1_900_000, op="peek"), at(1_900_000, op="acquire", lease="c"),
                         at(1_900_000, op="release", lease="c"), at(1_900_000, op="renew", lease="c"),
                         at(1_900_000, op="renew", lease="z"), at(1_900_000, op="peek")]))
cases.append(dict(name="cc_retry_is_nth_end", key="k",
                  note="3 slots: a rejected acquire waits for the earliest end among the live leases; after a release, a slot is free at once",
                  limit=dict(algorithm="concurrency", max_in_flight=3, lease_us=5 * S),
                  steps=[at(0, op="acquire", lease="a"), at(2 * S, op="acquire", lease="b"), at(S, op="acquire", lease="c"),
                         at(3 * S, op="acquire", lease="d"), at(3 * S, op="release", lease="b"), at(3 * S, op="acquire", lease="d"),
                         at(5 * S, op="peek"), at(6 * S, op="peek"), at(6 * S, op="acquire", lease="e")]))

# The sliding-window counter: this window's count plus the previous
# window's, weighted by the share of it the sliding period still overlaps.
cases.append(dict(name="sw_weighted_count", key="k",
                  note="10 per 10 s: 10 taken in the first window; at 12.5 s the previous 10 weigh 7.5, so 2.5 more fit; the next token when the weight is 0.5, at 19.5 s; two windows later nothing is counted",
                  limit=dict(algorithm="sliding_window", rate=10, period_us=10 * S),
                  steps=[at(0, op="peek"), at(0, cost=6), at(5 * S, cost=4), at(9 * S), at(10 * S, op="peek"), at(12_500_000, cost=2),
                         at(12_500_000, cost=0.5), at(12_500_000), at(19_499_999, op="peek"), at(19_500_000), at(25 * S, op="peek"),
                         at(40 * S, op="peek", cost=10)]))
cases.append(dict(name="sw_no_boundary_burst", key="k",
                  note="10/s: 10 at the end of one window leave the next window's start short; where a fixed window admits 20 within 2 us, the counter admits 1 in the first 0.1 s",
                  limit=dict(algorithm="sliding_window", rate=10, period_us=S),
                  steps=[at(999_999, cost=10), at(S), at(S + 1, op="peek"), at(1_099_999), at(1_100_000), at(1_100_000),
                         at(1_500_000, cost=4), at(1_500_000), at(2_000_000, op="peek", cost=10)]))
cases.append(dict(name="sw_wait_into_next_window", key="k",
                  note="8 per s: a cost of 5 with 6 counted in this window waits for the next, where the 6 weigh 3 or less once half of it has passed",
                  limit=dict(algorithm="sliding_window", rate=8, period_us=S),
                  steps=[at(100_000, cost=6), at(200_000, cost=5), at(200_000, op="peek", cost=2), at(S + 375_000, op="peek", cost=5),
                         at(S + 499_999, op="peek", cost=5), at(S + 500_000, cost=5), at(S + 500_000, op="peek")]))
cases.append(dict(name="sw_capacity_and_fractions", key="k",
                  note="7 per 3 s with capacity 5: weights that are no whole micro-token round up",
                  limit=dict(algorithm="sliding_window", rate=7, period_us=3 * S, capacity=5),
                  steps=[at(1, cost=4.5), at(1_000_000, cost=0.5), at(3_000_001, op="peek"), at(3_000_001, cost=0.000001),
                         at(4_000_000, cost=1.5), at(4_000_000, cost=0.2), at(5_123_457, op="peek", cost=5), at(7_654_321, cost=3.3)]))
cases.append(dict(name="sw_refund", key="k",
                  note="a refund takes from this window's count first, then from the previous one's; an absent key is full",
                  limit=dict(algorithm="sliding_window", rate=10, period_us=S),
                  steps=[at(0, op="refund", cost=3), at(0, cost=4), at(500_000, cost=5), at(1_200_000, cost=2),
                         at(1_300_000, op="refund", cost=3), at(1_300_000, op="peek"), at(1_400_000, op="refund", cost=1e12), at(1_400_000, op="peek", cost=10)]))
cases.append(dict(name="sw_reserve_refused", key="k",
                  note="no turn to reserve: a reservation is refused, a cost above the capacity can never succeed",
                  limit=dict(algorithm="sliding_window", rate=3, period_us=S),
                  steps=[at(0, reserve=True, want_error="reserve_unsupported"), at(0, cost=4, want_error="cost_exceeds_limit"), at(0, cost=3)]))


def local(tz, y, mo, d, h=0, mi=0, sec=0, us=0):
    """Microseconds since the epoch of a local wall time in tz."""
    return to_us(datetime(y, mo, d, h, mi, sec, us, tzinfo=ZoneInfo(tz)))


# Calendar periods: windows from local midnight in an IANA zone, as long as
# the calendar says (a day of 23 or 25 hours across a change of summer
# time, months of 28 to 31 days, a leap year). Every store is given the
# boundaries from the process, where the zone database is.
NY, BER, SYD = "America/New_York", "Europe/Berlin", "Australia/Sydney"
cases.append(dict(name="fw_calendar_month_lengths", key="acct-1",
                  note="1000 per calendar month in New York: used up mid-month, a rejection waits for the 1st at local midnight: 31, 29 (2024), 28 (2023) and 30-day months; the reset is the same boundary",
                  limit=dict(algorithm="fixed_window", rate=1000, calendar="month", timezone=NY),
                  steps=[at(local(NY, 2023, 2, 28, 12), cost=1000), at(local(NY, 2023, 2, 28, 12)), at(local(NY, 2023, 3, 1), cost=1000),
                         at(local(NY, 2024, 1, 15, 12), cost=1000), at(local(NY, 2024, 1, 31, 23, 59, 59, 999_999)),
                         at(local(NY, 2024, 2, 1), op="peek"), at(local(NY, 2024, 2, 10, 8), cost=999), at(local(NY, 2024, 2, 29, 23), cost=2),
                         at(local(NY, 2024, 4, 30, 23, 59), cost=1000), at(local(NY, 2024, 4, 30, 23, 59), op="peek")]))
cases.append(dict(name="fw_calendar_day_dst_new_york", key="k",
                  note="100 per day in New York: 2024-03-10 is 23 hours long and 2024-11-03 25; a rejection at 22:00 waits 2 hours of wall clock either way",
                  limit=dict(algorithm="fixed_window", rate=100, calendar="day", timezone=NY),
                  steps=[at(local(NY, 2024, 3, 10, 0, 30), cost=100), at(local(NY, 2024, 3, 10, 22)), at(local(NY, 2024, 3, 11), op="peek"),
                         at(local(NY, 2024, 11, 3, 0, 30), cost=60), at(local(NY, 2024, 11, 3, 22), cost=41),
                         at(local(NY, 2024, 11, 3, 22), op="peek"), at(local(NY, 2024, 11, 3, 23, 59, 59, 999_999), cost=40), at(local(NY, 2024, 11, 4), cost=100)]))
cases.append(dict(name="fw_calendar_day_dst_berlin", key="k",
                  note="5 per day in Berlin: 2024-03-31 (23 hours) and 2024-10-27 (25 hours), taken at 01:00 local, reset at the next local midnight",
                  limit=dict(algorithm="fixed_window", rate=5, calendar="day", timezone=BER),
                  steps=[at(local(BER, 2024, 3, 31, 1), cost=5), at(local(BER, 2024, 3, 31, 1)), at(local(BER, 2024, 10, 27, 1), cost=5),
                         at(local(BER, 2024, 10, 27, 4), op="peek"), at(local(BER, 2024, 10, 27, 23), op="refund", cost=2), at(local(BER, 2024, 10, 27, 23), cost=2)]))
cases.append(dict(name="fw_calendar_week_berlin", key="k",
                  note="10 per week from Monday in Berlin: a Sunday rejection waits for Monday's local midnight, across the end of summer time (a week of 169 hours)",
                  limit=dict(algorithm="fixed_window", rate=10, calendar="week", timezone=BER),
                  steps=[at(local(BER, 2024, 10, 21, 9), cost=10), at(local(BER, 2024, 10, 27, 12)), at(local(BER, 2024, 10, 28), cost=10),
                         at(local(BER, 2024, 10, 30), reserve=True, want_error="reserve_unsupported")]))
cases.append(dict(name="fw_calendar_year_end_utc", key="k",
                  note="3 per calendar year in UTC (no zone given): 2024 has 366 days; the last microsecond of the year, then the first of the next",
                  limit=dict(algorithm="fixed_window", rate=3, calendar="year"),
                  steps=[at(local("UTC", 2024, 1, 1), cost=3), at(local("UTC", 2024, 12, 31, 23, 59, 59, 999_999)),
                         at(local("UTC", 2025, 1, 1), cost=3), at(local("UTC", 2025, 6, 1), op="peek")]))
CD3 = dict(algorithm="fixed_window", rate=3, calendar="day")
cases.append(dict(name="fw_calendar_reload_keeps_count", key="k",
                  note="3 per calendar day used up, raised to 5: 2 more that day; lowered to 4: none left (5 used); the next day brings 4",
                  limit=CD3,
                  steps=[at(local("UTC", 2024, 5, 1, 8), cost=3), at(local("UTC", 2024, 5, 1, 9), limit=dict(CD3, rate=5)),
                         at(local("UTC", 2024, 5, 1, 10)), at(local("UTC", 2024, 5, 1, 11)),
                         at(local("UTC", 2024, 5, 1, 12), op="peek", limit=dict(CD3, rate=4)), at(local("UTC", 2024, 5, 1, 13)),
                         at(local("UTC", 2024, 5, 2), op="peek", cost=4), at(local("UTC", 2024, 5, 2), cost=4)]))
cases.append(dict(name="sw_calendar_day_dst_sydney", key="k",
                  note="sliding over calendar days in Sydney: 2024-04-07 is 25 hours long, 2024-10-06 23; the previous day's count weighs by the share of today still to come",
                  limit=dict(algorithm="sliding_window", rate=24, calendar="day", timezone=SYD),
                  steps=[at(local(SYD, 2024, 4, 6, 12), cost=24), at(local(SYD, 2024, 4, 7, 6), op="peek"), at(local(SYD, 2024, 4, 7, 12), cost=12),
                         at(local(SYD, 2024, 4, 7, 12)), at(local(SYD, 2024, 4, 8, 1), op="peek"),
                         at(local(SYD, 2024, 10, 5, 23), cost=24), at(local(SYD, 2024, 10, 6, 12), op="peek"), at(local(SYD, 2024, 10, 6, 18), cost=6)]))
cases.append(dict(name="sw_calendar_month_new_york", key="k",
                  note="sliding over calendar months in New York: February 2024's count weighs into March (31 days, with the change to summer time) by March's share still to come",
                  limit=dict(algorithm="sliding_window", rate=31, calendar="month", timezone=NY),
                  steps=[at(local(NY, 2024, 2, 20), cost=31), at(local(NY, 2024, 3, 1), op="peek"), at(local(NY, 2024, 3, 16, 12), cost=15),
                         at(local(NY, 2024, 3, 16, 12)), at(local(NY, 2024, 3, 31, 23), op="peek", cost=16), at(local(NY, 2024, 5, 1), op="peek")]))


print(json.dumps({"cases": [run(c) for c in cases]}, indent=1))
