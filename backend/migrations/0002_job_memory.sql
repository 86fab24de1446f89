-- moe-studio server registry, version 2: the memory of a job's process
-- group (bytes; resident anonymous + shared memory) and its limit.
ALTER TABLE jobs ADD COLUMN memory_current INTEGER;
ALTER TABLE jobs ADD COLUMN memory_peak INTEGER;
ALTER TABLE jobs ADD COLUMN memory_limit INTEGER;
