-- Renewing a concurrency limit's lease without acquiring (sluice.OpRenew,
-- the decision API's /v1/renew): sluice_lease gains op 'n', which extends
-- p_id's lease while it is live and otherwise rejects, adding nothing.
-- The other ops answer as in 0007, so a binary that predates this file
-- keeps working on a database that has it. The function is replaced
-- whole (PL/pgSQL has no other way); CREATE OR REPLACE keeps the file safe
-- to run again.
-- p_op: 't' acquire (or renew p_id's lease), 'p' peek (what 't' would
-- answer; the caller writes nothing), 'r' release p_id's lease, 'n' renew
-- p_id's lease only while it is live (never acquire). p_n is the
-- number of slots, p_lease the lease's length. ids and ends are the leases
-- after op (for a peek, after the acquire it would be); tokens is
-- (p_n - leases held) * 1e6; reset the wait until every lease has ended;
-- retry, for a rejected acquire, the wait until enough have ended for a
-- slot to be free (0 for the other ops).
CREATE OR REPLACE FUNCTION sluice_lease(
    p_present boolean, p_ids uuid[], p_ends bigint[],
    p_now bigint, p_op text, p_id uuid, p_n bigint, p_lease bigint
) RETURNS sluice_lease_result
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    r      sluice_lease_result;
    v_live bigint;
    v_held boolean;
    v_k    bigint;
BEGIN
    IF NOT p_present THEN
        p_ids := NULL;
        p_ends := NULL;
    END IF;
    -- Set-based rather than element by element: appending to an array in
    -- a loop copies it each time, and a key may hold thousands of leases.
    SELECT count(*), coalesce(bool_or(u.id = p_id), false) INTO v_live, v_held
    FROM unnest(p_ids, p_ends) AS u(id, e)
    WHERE u.e > p_now;
    -- An acquire or its peek may take a free slot; a release or a
    -- renewal only acts on p_id's own live lease.
    IF p_op IN ('t', 'p') THEN
        r.allowed := v_held OR v_live < p_n;
    ELSE
        r.allowed := v_held;
    END IF;

    SELECT coalesce(array_agg(x.id ORDER BY x.ord), '{}'), coalesce(array_agg(x.e ORDER BY x.ord), '{}')
    INTO r.ids, r.ends
    FROM (
        SELECT u.id, u.ord,
            CASE WHEN u.id = p_id AND r.allowed THEN greatest(u.e, p_now + p_lease) ELSE u.e END AS e
        FROM unnest(p_ids, p_ends) WITH ORDINALITY AS u(id, e, ord)
        WHERE u.e > p_now AND NOT (p_op = 'r' AND u.id = p_id)
    ) x;
    IF r.allowed AND p_op IN ('t', 'p') AND NOT v_held THEN
        r.ids := r.ids || p_id;
        r.ends := r.ends || (p_now + p_lease);
    END IF;

    r.tokens := (p_n - coalesce(array_length(r.ids, 1), 0)) * 1000000;
    SELECT coalesce(max(e) - p_now, 0) INTO r.reset FROM unnest(r.ends) AS e;
    r.retry := 0;
    IF NOT r.allowed AND p_op IN ('t', 'p') THEN
        -- The (live - n + 1)-th earliest end: then one slot is free.
        v_k := v_live - p_n + 1;
        IF v_k >= 1 THEN
            SELECT e - p_now INTO r.retry FROM unnest(r.ends) AS e ORDER BY e OFFSET v_k - 1 LIMIT 1;
            r.retry := coalesce(r.retry, 0);
        END IF;
    END IF;
    RETURN r;
END
$$;
