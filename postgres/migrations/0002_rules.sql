-- Rate-limit rules managed with SQL, a rule source beside the config file.
-- A row with plan NULL applies to every plan; a row for a plan replaces
-- the NULL-plan row of the same key_pattern for requests of that plan.
-- NULLS NOT DISTINCT keeps one NULL-plan row per key_pattern (PostgreSQL 15+).
CREATE TABLE sluice_rules (
    rule_id         bigserial PRIMARY KEY,
    key_pattern     varchar(128) NOT NULL CHECK (key_pattern <> ''),
    scope           varchar(32)  NOT NULL CHECK (scope IN ('user', 'endpoint', 'global', 'ip')),
    rate_per_second double precision NOT NULL,
    burst_capacity  integer      NOT NULL,
    plan            varchar(32),
    is_active       boolean      NOT NULL DEFAULT true,
    description     text,
    created_at      timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT sluice_rules_pattern_plan UNIQUE NULLS NOT DISTINCT (key_pattern, plan)
);

-- Any change to the rules wakes the listeners, which reload the whole set.
CREATE FUNCTION sluice_rules_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_rules', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER sluice_rules_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sluice_rules
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_rules_notify();
