-- The state columns' comments name the Go type that holds the same two
-- numbers, engine.State (the state moved there from the root package):
-- comments only, no change to a value or a function.
COMMENT ON COLUMN sluice_buckets.a IS 'engine.State.Tokens: a token bucket''s scaled tokens, or a fixed window''s micro-tokens';
COMMENT ON COLUMN sluice_buckets.b IS 'engine.State.Stamp: the microsecond a token bucket''s refill is counted to, or a fixed window''s start';
