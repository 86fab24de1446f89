-- moe-studio server registry, version 3: when a running job's cancel was
-- requested (ms since the epoch; NULL: none), so that a job the server
-- stopped with while it was being cancelled is recorded `cancelled` at the
-- next start, not `interrupted` (which --auto-resume would run again).
ALTER TABLE jobs ADD COLUMN cancel_requested_at INTEGER;
