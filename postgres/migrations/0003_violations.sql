-- Rejections, for an operator asking who hit which limit. Written in
-- batches with COPY, off the request path. rule is the rule's name (rules
-- from the config file have no row in sluice_rules); rule_id is set when
-- the rule came from sluice_rules.
CREATE TABLE sluice_violations (
    violation_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    bucket_key     varchar(256)     NOT NULL,
    user_id        text,
    ip_address     inet,
    endpoint       varchar(255),
    requested_at   timestamptz      NOT NULL DEFAULT now(),
    tokens_at_time double precision NOT NULL,
    rule           text             NOT NULL,
    rule_id        bigint REFERENCES sluice_rules (rule_id) ON DELETE SET NULL
);

CREATE INDEX sluice_violations_user ON sluice_violations (user_id, requested_at DESC);
CREATE INDEX sluice_violations_ip   ON sluice_violations (ip_address, requested_at DESC);
-- "the newest since ..." for sluice violations --since.
CREATE INDEX sluice_violations_time ON sluice_violations (requested_at DESC);
