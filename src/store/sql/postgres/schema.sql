CREATE TABLE IF NOT EXISTS kb_jobs (
  job TEXT PRIMARY KEY, snapshot_epoch BIGINT NOT NULL, vnode_count INT NOT NULL, partition_count INT NOT NULL,
  generation BIGINT NOT NULL, phase TEXT NOT NULL, recreations BIGINT NOT NULL, next_lease BIGINT NOT NULL,
  table_name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kb_vnode_progress (
  job TEXT NOT NULL, vnode INT NOT NULL, epoch BIGINT NOT NULL, row_count BIGINT NOT NULL,
  finished BOOLEAN NOT NULL, cursor BYTEA, PRIMARY KEY (job, vnode));
CREATE TABLE IF NOT EXISTS kb_partition_progress (
  job TEXT NOT NULL, partition INT NOT NULL, next_offset BIGINT NOT NULL, epoch BIGINT NOT NULL,
  streaming BOOLEAN NOT NULL, PRIMARY KEY (job, partition));
CREATE TABLE IF NOT EXISTS kb_rate_limits (
  job TEXT PRIMARY KEY, snapshot_rows_per_second BIGINT NOT NULL, log_records_per_second BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS kb_job_control (
  job TEXT PRIMARY KEY, paused BOOLEAN NOT NULL);
CREATE TABLE IF NOT EXISTS kb_leases (
  job TEXT NOT NULL, partition INT NOT NULL, owner TEXT NOT NULL, lease BIGINT NOT NULL, PRIMARY KEY (job, partition));
CREATE TABLE IF NOT EXISTS kb_dead_letters (
  job TEXT NOT NULL, partition INT NOT NULL, record_offset BIGINT NOT NULL, epoch BIGINT NOT NULL,
  generation BIGINT NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (job, partition, record_offset));
CREATE TABLE IF NOT EXISTS kb_publication (
  job TEXT PRIMARY KEY, published_epoch BIGINT, visible_epoch BIGINT);
CREATE TABLE IF NOT EXISTS kb_pending_units (
  unit BIGSERIAL PRIMARY KEY, job TEXT NOT NULL, epoch BIGINT NOT NULL, partitions INT[] NOT NULL);
CREATE TABLE IF NOT EXISTS kb_schema_history (
  job TEXT NOT NULL, version INT NOT NULL, from_epoch BIGINT NOT NULL, fingerprint TEXT NOT NULL,
  row_schema TEXT NOT NULL, applied_epoch BIGINT, PRIMARY KEY (job, version));
CREATE TABLE IF NOT EXISTS kb_job_tables (
  table_name TEXT PRIMARY KEY, job TEXT NOT NULL, log_table INT NOT NULL);
CREATE TABLE IF NOT EXISTS kb_pending_rows (
  unit BIGINT NOT NULL, seq INT NOT NULL, vnode INT NOT NULL, key BYTEA NOT NULL, row BYTEA,
  PRIMARY KEY (unit, seq));
