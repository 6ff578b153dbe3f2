-- Small values every process of a fleet shares besides bucket state: the
-- adaptive rates (package adaptive's Values). One row per key; keys are
-- bytea and carry the store's key prefix, as sluice_buckets' do.
--
-- expires_at is integer microseconds of the store's clock, as full_at is
-- in sluice_buckets: a row past it reads as absent, a compare-and-swap
-- from "nothing" writes over it, and housekeeping deletes it through its
-- index.
CREATE TABLE IF NOT EXISTS sluice_values (
    key        bytea  PRIMARY KEY,
    value      text   NOT NULL,
    expires_at bigint NOT NULL
);

CREATE INDEX IF NOT EXISTS sluice_values_expires_at ON sluice_values (expires_at);
