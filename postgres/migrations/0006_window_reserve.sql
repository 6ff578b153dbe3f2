-- Reservations on fixed windows, and reservations above the capacity.
--
-- sluice_step's fixed window now reserves as its token bucket does
-- (sluice.TakeFixedWindow): with p_reserve, a request that finds too few
-- tokens is admitted when the debt it leaves is at most p_maxres; the
-- tokens go negative, later windows pay the debt before they add
-- anything, and retry is the wait until the boundary that pays it. A
-- rejected reservation waits until its debt would fit.
--
-- sluice_refund's fixed window gives back the whole amount, paying debt
-- first, up to the capacity: the amount is at most what one request can
-- be charged (capacity plus max_reserved, sluice.Request.Charge), where it
-- was at most the capacity before.
--
-- The token bucket needs no change: a reservation above the capacity is
-- the same arithmetic. The Go side judges every cost and bounds the debt
-- (sluice.MaxDebt), so every value stays within bigint.
--
-- Signatures and parameter names are 0005's: CREATE OR REPLACE suffices,
-- and running the file again changes nothing.

-- sluice_step is the root package's arithmetic (TakeTokenBucket,
-- TakeFixedWindow, TakeSlidingLog in tokenbucket.go, fixedwindow.go,
-- slidinglog.go) transcribed to PL/pgSQL, integer for integer: the same
-- truncating divisions, the same clamps, the same overflow guards. It is a
-- pure function; the statements that call it read and write the row.
--
-- p_alg: 0 token bucket, 1 fixed window, 2 sliding log, 3 leaky bucket.
-- p_off is the fixed-window offset the Go side computed (the limit's start,
-- or sluice.WindowOffset of the key); it matters only for an absent row.
-- write reports whether the state must be stored (take and admitted).
CREATE OR REPLACE FUNCTION sluice_step(
    p_present boolean, p_alg smallint, p_tokens bigint, p_stamp bigint,
    p_log_at bigint[], p_log_cost bigint[],
    p_now bigint, p_cost bigint, p_take boolean,
    p_num bigint, p_den bigint, p_cap bigint, p_wrate bigint,
    p_period bigint, p_off bigint, p_reserve boolean, p_maxres bigint
) RETURNS sluice_step_result
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    r       sluice_step_result;
    v_full  bigint;
    v_tok   bigint;
    v_stamp bigint;
    v_gap   bigint;
    v_lag   bigint;
    v_need  bigint;
    v_into  bigint;
    v_k     bigint;
    v_n     int;
    v_first int;
    v_eff   bigint;
    v_used  bigint;
    v_exc   bigint;
    i       int;
BEGIN
    r.allowed := false;
    r.retry := 0;
    r.reset := 0;
    IF p_alg = 1 THEN
        -- Fixed window with rollover (TakeFixedWindow).
        v_into := (p_now - p_off) % p_period;
        IF v_into < 0 THEN
            v_into := v_into + p_period;
        END IF;
        v_tok := p_cap;
        v_stamp := p_now - v_into;
        IF p_present THEN
            v_tok := p_tokens;
            v_stamp := p_stamp;
            IF p_now - v_stamp >= p_period THEN
                v_k := (p_now - v_stamp) / p_period;
                v_stamp := v_stamp + v_k * p_period;
                IF v_k > (p_cap - v_tok) / p_wrate THEN
                    v_tok := p_cap;
                ELSE
                    v_tok := v_tok + v_k * p_wrate;
                END IF;
            END IF;
            IF v_tok > p_cap THEN
                v_tok := p_cap;
            END IF;
        END IF;
        IF v_tok >= p_cost THEN
            r.allowed := true;
            v_tok := v_tok - p_cost;
        ELSIF p_reserve AND p_cost - v_tok <= p_maxres THEN
            -- A reservation: the debt is paid at the boundary named.
            r.allowed := true;
            v_tok := v_tok - p_cost;
            r.retry := v_stamp + ((-v_tok) / p_wrate + ((-v_tok) % p_wrate <> 0)::int) * p_period - p_now;
        ELSE
            v_need := p_cost - v_tok;
            IF p_reserve THEN
                v_need := v_need - p_maxres;
            END IF;
            r.retry := v_stamp + (v_need / p_wrate + (v_need % p_wrate <> 0)::int) * p_period - p_now;
        END IF;
        r.tokens := v_tok;
        IF v_tok < p_cap THEN
            v_need := p_cap - v_tok;
            r.reset := v_stamp + (v_need / p_wrate + (v_need % p_wrate <> 0)::int) * p_period - p_now;
        END IF;
        r.a := v_tok;
        r.b := v_stamp;
        r.write := p_take AND r.allowed;
        RETURN r;
    ELSIF p_alg = 2 THEN
        -- Sliding-window log (TakeSlidingLog); arrays are 1-based.
        r.log_at := p_log_at;
        r.log_cost := p_log_cost;
        v_n := 0;
        IF p_present THEN
            v_n := coalesce(array_length(p_log_at, 1), 0);
        ELSE
            r.log_at := '{}';
            r.log_cost := '{}';
        END IF;
        v_eff := p_now;
        IF v_n > 0 AND p_log_at[v_n] > v_eff THEN
            v_eff := p_log_at[v_n];
        END IF;
        v_first := 1;
        WHILE v_first <= v_n AND p_log_at[v_first] <= v_eff - p_period LOOP
            v_first := v_first + 1;
        END LOOP;
        v_used := 0;
        FOR i IN v_first .. v_n LOOP
            v_used := v_used + p_log_cost[i];
        END LOOP;
        IF v_used + p_cost <= p_cap THEN
            r.allowed := true;
            v_used := v_used + p_cost;
            IF p_take THEN
                IF v_first <= v_n THEN
                    r.log_at := p_log_at[v_first:v_n] || v_eff;
                    r.log_cost := p_log_cost[v_first:v_n] || p_cost;
                ELSE
                    r.log_at := ARRAY[v_eff];
                    r.log_cost := ARRAY[p_cost];
                END IF;
                v_n := array_length(r.log_at, 1);
                v_first := 1;
            END IF;
        ELSE
            v_exc := v_used + p_cost - p_cap;
            FOR i IN v_first .. v_n LOOP
                v_exc := v_exc - p_log_cost[i];
                IF v_exc <= 0 THEN
                    r.retry := p_log_at[i] + p_period - p_now;
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        r.tokens := p_cap - v_used;
        IF r.allowed AND NOT p_take THEN
            r.reset := v_eff + p_period - p_now;
        ELSIF v_n >= v_first THEN
            r.reset := r.log_at[v_n] + p_period - p_now;
        END IF;
        r.a := 0;
        r.b := 0;
        r.write := p_take AND r.allowed;
        RETURN r;
    END IF;

    -- Token and leaky buckets (TakeTokenBucket). Tokens are scaled by den,
    -- so the refill over e microseconds is exactly e*num; every scaled value
    -- stays below 2^62 and the refill is capped before it is multiplied.
    v_full := p_cap * p_den;
    v_tok := v_full;
    v_stamp := p_now;
    IF p_present THEN
        v_tok := p_tokens;
        v_stamp := p_stamp;
        IF p_now > v_stamp THEN
            IF v_tok < v_full THEN
                v_gap := v_full - v_tok;
                -- elapsed*num >= gap, without forming a product that overflows.
                IF p_now - v_stamp >= v_gap / p_num + (v_gap % p_num <> 0)::int THEN
                    v_tok := v_full;
                ELSE
                    v_tok := v_tok + (p_now - v_stamp) * p_num;
                END IF;
            END IF;
            v_stamp := p_now;
        END IF;
        IF v_tok > v_full THEN
            v_tok := v_full;
        END IF;
    END IF;
    v_lag := v_stamp - p_now;
    v_need := p_cost * p_den;
    IF v_tok >= v_need THEN
        r.allowed := true;
        v_tok := v_tok - v_need;
    ELSIF p_reserve AND v_need - v_tok <= p_maxres * p_den THEN
        r.allowed := true;
        v_tok := v_tok - v_need;
        r.retry := v_lag + ((-v_tok) / p_num + ((-v_tok) % p_num <> 0)::int);
    ELSE
        IF p_reserve THEN
            v_need := v_need - p_maxres * p_den;
        END IF;
        v_gap := v_need - v_tok;
        r.retry := v_lag + (v_gap / p_num + (v_gap % p_num <> 0)::int);
    END IF;
    -- floor division: PostgreSQL's / truncates toward zero like Go's.
    r.tokens := v_tok / p_den;
    IF v_tok < 0 AND v_tok % p_den <> 0 THEN
        r.tokens := r.tokens - 1;
    END IF;
    IF v_tok < v_full THEN
        v_gap := v_full - v_tok;
        r.reset := v_lag + (v_gap / p_num + (v_gap % p_num <> 0)::int);
    END IF;
    r.a := v_tok;
    r.b := v_stamp;
    r.write := p_take AND r.allowed;
    RETURN r;
END
$$;

-- sluice_refund gives tokens back (sluice.OpRefund): the root package's
-- RefundTokenBucket, RefundFixedWindow and RefundSlidingLog (tokenbucket.go,
-- fixedwindow.go, slidinglog.go) transcribed to PL/pgSQL, integer for
-- integer, as sluice_step transcribes the takes. It is a pure function; the
-- refund statement updates an existing row with it and inserts none, since
-- a key with no state is full already.
--
-- The parameters are sluice_step's, without the take, reserve and
-- max-reserved flags; p_amount is the micro-tokens to give back. write
-- reports whether the state must be stored: whenever the row is present.
-- The result is always allowed and describes the state after the refund.
CREATE OR REPLACE FUNCTION sluice_refund(
    p_present boolean, p_alg smallint, p_tokens bigint, p_stamp bigint,
    p_log_at bigint[], p_log_cost bigint[],
    p_now bigint, p_amount bigint,
    p_num bigint, p_den bigint, p_cap bigint, p_wrate bigint,
    p_period bigint, p_off bigint
) RETURNS sluice_step_result
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    r       sluice_step_result;
    v_full  bigint;
    v_tok   bigint;
    v_stamp bigint;
    v_gap   bigint;
    v_lag   bigint;
    v_need  bigint;
    v_into  bigint;
    v_k     bigint;
    v_n     int;
    v_first int;
    v_eff   bigint;
    v_used  bigint;
    v_amt   bigint;
    v_at    bigint[];
    v_cost  bigint[];
    i       int;
BEGIN
    r.write := p_present;
    r.allowed := true;
    r.retry := 0;
    r.reset := 0;
    IF p_alg = 1 THEN
        -- Fixed window (RefundFixedWindow): roll forward as a take would.
        v_into := (p_now - p_off) % p_period;
        IF v_into < 0 THEN
            v_into := v_into + p_period;
        END IF;
        v_tok := p_cap;
        v_stamp := p_now - v_into;
        IF p_present THEN
            v_tok := p_tokens;
            v_stamp := p_stamp;
            IF p_now - v_stamp >= p_period THEN
                v_k := (p_now - v_stamp) / p_period;
                v_stamp := v_stamp + v_k * p_period;
                IF v_k > (p_cap - v_tok) / p_wrate THEN
                    v_tok := p_cap;
                ELSE
                    v_tok := v_tok + v_k * p_wrate;
                END IF;
            END IF;
            IF v_tok > p_cap THEN
                v_tok := p_cap;
            END IF;
            -- The amount pays back debt too; it is at most what one
            -- request can be charged, so the sum stays in range.
            v_tok := least(p_cap, v_tok + p_amount);
        END IF;
        r.tokens := v_tok;
        IF v_tok < p_cap THEN
            v_need := p_cap - v_tok;
            r.reset := v_stamp + (v_need / p_wrate + (v_need % p_wrate <> 0)::int) * p_period - p_now;
        END IF;
        r.a := v_tok;
        r.b := v_stamp;
        RETURN r;
    ELSIF p_alg = 2 THEN
        -- Sliding-window log (RefundSlidingLog); arrays are 1-based.
        r.a := 0;
        r.b := 0;
        IF NOT p_present THEN
            r.log_at := '{}';
            r.log_cost := '{}';
            r.tokens := p_cap;
            RETURN r;
        END IF;
        v_n := coalesce(array_length(p_log_at, 1), 0);
        v_eff := p_now;
        IF v_n > 0 AND p_log_at[v_n] > v_eff THEN
            v_eff := p_log_at[v_n];
        END IF;
        v_first := 1;
        WHILE v_first <= v_n AND p_log_at[v_first] <= v_eff - p_period LOOP
            v_first := v_first + 1;
        END LOOP;
        -- Take the amount back from the newest entries; the last one
        -- touched may keep part of its cost.
        v_amt := p_amount;
        WHILE v_n >= v_first AND v_amt > 0 LOOP
            IF p_log_cost[v_n] > v_amt THEN
                EXIT;
            END IF;
            v_amt := v_amt - p_log_cost[v_n];
            v_n := v_n - 1;
        END LOOP;
        v_at := '{}';
        v_cost := '{}';
        v_used := 0;
        FOR i IN v_first .. v_n LOOP
            v_at := v_at || p_log_at[i];
            IF i = v_n AND v_amt > 0 THEN
                v_cost := v_cost || (p_log_cost[i] - v_amt);
            ELSE
                v_cost := v_cost || p_log_cost[i];
            END IF;
            v_used := v_used + v_cost[i - v_first + 1];
        END LOOP;
        r.log_at := v_at;
        r.log_cost := v_cost;
        r.tokens := p_cap - v_used;
        IF v_n >= v_first THEN
            r.reset := p_log_at[v_n] + p_period - p_now;
        END IF;
        RETURN r;
    END IF;

    -- Token and leaky buckets (RefundTokenBucket): refill to now exactly as
    -- a take, then add the amount, scaled, up to the capacity. Debt left by
    -- a reservation is paid back too.
    v_full := p_cap * p_den;
    v_tok := v_full;
    v_stamp := p_now;
    IF p_present THEN
        v_tok := p_tokens;
        v_stamp := p_stamp;
        IF p_now > v_stamp THEN
            IF v_tok < v_full THEN
                v_gap := v_full - v_tok;
                -- elapsed*num >= gap, without forming a product that overflows.
                IF p_now - v_stamp >= v_gap / p_num + (v_gap % p_num <> 0)::int THEN
                    v_tok := v_full;
                ELSE
                    v_tok := v_tok + (p_now - v_stamp) * p_num;
                END IF;
            END IF;
            v_stamp := p_now;
        END IF;
        IF v_tok > v_full THEN
            v_tok := v_full;
        END IF;
        -- amount*den >= full-tokens, without forming a product that overflows.
        IF p_amount >= (v_full - v_tok) / p_den + 1 THEN
            v_tok := v_full;
        ELSE
            v_tok := least(v_full, v_tok + p_amount * p_den);
        END IF;
    END IF;
    v_lag := v_stamp - p_now;
    -- floor division: PostgreSQL's / truncates toward zero like Go's.
    r.tokens := v_tok / p_den;
    IF v_tok < 0 AND v_tok % p_den <> 0 THEN
        r.tokens := r.tokens - 1;
    END IF;
    IF v_tok < v_full THEN
        v_gap := v_full - v_tok;
        r.reset := v_lag + (v_gap / p_num + (v_gap % p_num <> 0)::int);
    END IF;
    r.a := v_tok;
    r.b := v_stamp;
    RETURN r;
END
$$;
