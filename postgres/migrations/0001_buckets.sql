-- Bucket state, one row per storage key ("tb:per-user:user-42"). Keys are
-- bytea: they carry client-supplied bytes, which need not be valid UTF-8.
--
-- a, b are sluice.State's A and B (token-bucket scaled tokens and stamp,
-- or fixed-window tokens and window start); log_at/log_cost hold a sliding
-- log. alg and den record the shape the state was written under: a row
-- whose shape differs from the limit's is treated as absent, as the memory
-- store does. All times are integer microseconds of the store's clock.
--
-- full_at is when the state becomes equivalent to an absent row (the
-- bucket has refilled): housekeeping deletes rows with full_at in the past
-- through its index, in small batches.
--
-- at and the o_* columns carry the decision of the latest statement: "at"
-- brings the statement's single clock reading into ON CONFLICT DO UPDATE
-- (through EXCLUDED) and the o_* columns let RETURNING report a rejection's
-- remaining and retry-after although the state itself is left as it was.
CREATE TABLE sluice_buckets (
    key       bytea    PRIMARY KEY,
    alg       smallint NOT NULL,
    den       bigint   NOT NULL,
    a         bigint   NOT NULL,
    b         bigint   NOT NULL,
    log_at    bigint[],
    log_cost  bigint[],
    full_at   bigint   NOT NULL,
    at        bigint   NOT NULL,
    o_allowed boolean  NOT NULL,
    o_tokens  bigint   NOT NULL,
    o_retry   bigint   NOT NULL,
    o_reset   bigint   NOT NULL
) WITH (fillfactor = 80);

CREATE INDEX sluice_buckets_full_at ON sluice_buckets (full_at);

CREATE TYPE sluice_step_result AS (
    write    boolean,
    allowed  boolean,
    a        bigint,
    b        bigint,
    log_at   bigint[],
    log_cost bigint[],
    tokens   bigint,
    retry    bigint,
    reset    bigint
);

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
CREATE FUNCTION sluice_step(
    p_present boolean, p_alg smallint, p_a bigint, p_b bigint,
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
            v_tok := p_a;
            v_stamp := p_b;
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
        ELSE
            v_need := p_cost - v_tok;
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
        v_tok := p_a;
        v_stamp := p_b;
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
