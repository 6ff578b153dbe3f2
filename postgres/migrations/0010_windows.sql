-- Sliding windows and calendar windows: package engine's
-- TakeSlidingWindow, RefundSlidingWindow, TakeCalendarWindow and
-- RefundCalendarWindow transcribed to PL/pgSQL, integer for integer, as
-- sluice_step transcribes the root package's algorithms. A pure function;
-- the statements in windows.go read and write the row.
--
-- p_alg: 1 a fixed window on calendar boundaries (state: a tokens, b the
-- window's start, as a fixed window's), 5 a sliding window (a the
-- count, b the window's start, log_cost[1] the previous window's count).
-- p_bounds are a calendar window's five bounds (engine.Bounds), computed
-- by the caller where the time-zone database is; NULL for windows of
-- p_period from the epoch. With p_refund, p_cost is given back.
-- write reports whether the state must be stored. New functions only:
-- running the file again changes nothing.
CREATE OR REPLACE FUNCTION sluice_muldiv(a bigint, b bigint, c bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT floor(a::numeric * b / c)::bigint $$;

CREATE OR REPLACE FUNCTION sluice_window_step(
    p_present boolean, p_alg smallint, p_a bigint, p_b bigint, p_log_cost bigint[],
    p_now bigint, p_cost bigint, p_take boolean, p_refund boolean,
    p_cap bigint, p_period bigint, p_bounds bigint[]
) RETURNS sluice_step_result
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    r       sluice_step_result;
    v_b     bigint[];
    v_s     bigint;
    v_before bigint;
    v_start bigint;
    v_end   bigint;
    v_next  bigint;
    v_count bigint := 0;
    v_prev  bigint := 0;
    v_stamp bigint;
    v_w     bigint := 0;
    v_used  bigint;
    v_room  bigint;
    v_back  bigint;
BEGIN
    r.allowed := false;
    r.retry := 0;
    r.reset := 0;
    r.write := false;
    -- engine.Bounds and Bounds.Pick
    IF p_bounds IS NULL THEN
        v_s := p_now - (((p_now % p_period) + p_period) % p_period);
        v_b := ARRAY[v_s - p_period, v_s, v_s + p_period, v_s + 2 * p_period, v_s + 3 * p_period];
    ELSE
        v_b := p_bounds;
    END IF;
    IF p_now >= v_b[3] THEN
        v_before := v_b[2]; v_start := v_b[3]; v_end := v_b[4]; v_next := v_b[5];
    ELSE
        v_before := v_b[1]; v_start := v_b[2]; v_end := v_b[3]; v_next := v_b[4];
    END IF;

    IF p_alg = 1 THEN
        -- calendar fixed window: rollCalendar
        IF NOT p_present OR p_b < v_start THEN
            v_count := p_cap; v_stamp := v_start;
        ELSE
            v_count := least(p_a, p_cap); v_stamp := p_b;
        END IF;
        IF p_refund THEN
            IF p_present THEN
                v_count := least(p_cap, v_count + least(p_cost, p_cap));
            END IF;
            r.allowed := true;
            r.write := p_present;
        ELSIF v_count >= p_cost THEN
            r.allowed := true;
            v_count := v_count - p_cost;
            r.write := p_take;
        ELSE
            r.retry := v_end - p_now;
        END IF;
        r.tokens := v_count;
        IF v_count < p_cap THEN r.reset := v_end - p_now; END IF;
        r.a := v_count;
        r.b := v_stamp;
        RETURN r;
    END IF;

    -- sliding window: rollSliding
    v_stamp := v_start;
    IF p_present THEN
        IF p_b >= v_start THEN
            v_count := p_a; v_prev := coalesce(p_log_cost[1], 0); v_stamp := p_b;
        ELSIF p_b >= v_before THEN
            v_prev := p_a;
        END IF;
    END IF;
    IF p_refund THEN
        IF NOT p_present THEN
            r.allowed := true; r.tokens := p_cap;
            RETURN r;
        END IF;
        v_back := least(p_cost, v_count);
        v_count := v_count - v_back;
        v_prev := v_prev - least(p_cost - v_back, v_prev);
    END IF;
    IF v_prev > 0 THEN
        v_w := v_prev - sluice_muldiv(v_prev, greatest(p_now - v_start, 0), v_end - v_start);
    END IF;
    v_used := v_count + v_w;
    IF p_refund THEN
        r.allowed := true;
        r.write := true;
    ELSIF v_used + p_cost <= p_cap THEN
        r.allowed := true;
        v_used := v_used + p_cost;
        v_count := v_count + p_cost;
        r.write := p_take;
    ELSE
        v_room := p_cap - v_count - p_cost;
        IF v_room >= 0 THEN
            r.retry := v_end - sluice_muldiv(v_room, v_end - v_start, v_prev) - p_now;
        ELSE
            v_room := p_cap - p_cost;
            IF v_count <= v_room THEN
                r.retry := v_end - p_now;
            ELSE
                r.retry := v_next - sluice_muldiv(v_room, v_next - v_end, v_count) - p_now;
            END IF;
        END IF;
    END IF;
    r.tokens := p_cap - v_used;
    IF v_count > 0 THEN
        r.reset := v_next - p_now;
    ELSIF v_w > 0 THEN
        r.reset := v_end - p_now;
    END IF;
    r.a := v_count;
    r.b := v_stamp;
    r.log_cost := ARRAY[v_prev];
    RETURN r;
END $$;
