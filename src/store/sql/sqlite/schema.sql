CREATE TABLE IF NOT EXISTS kb_jobs (
  job TEXT PRIMARY KEY,
  snapshot_epoch INTEGER NOT NULL,
  vnode_count INTEGER NOT NULL,
  partition_count INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  phase TEXT NOT NULL,
  recreations INTEGER NOT NULL,
  next_lease INTEGER NOT NULL,
  table_name TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kb_vnode_progress (
  job TEXT NOT NULL, vnode INTEGER NOT NULL, epoch INTEGER NOT NULL, row_count INTEGER NOT NULL,
  finished INTEGER NOT NULL, cursor BLOB, PRIMARY KEY (job, vnode)
);
CREATE TABLE IF NOT EXISTS kb_partition_progress (
  job TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL, epoch INTEGER NOT NULL,
  streaming INTEGER NOT NULL, PRIMARY KEY (job, partition)
);
CREATE TABLE IF NOT EXISTS kb_rate_limits (
  job TEXT PRIMARY KEY, snapshot_rows_per_second INTEGER NOT NULL,
  log_records_per_second INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS kb_job_control (
  job TEXT PRIMARY KEY, paused INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS kb_dead_letters (
  job TEXT NOT NULL, partition INTEGER NOT NULL, record_offset INTEGER NOT NULL,
  epoch INTEGER NOT NULL, generation INTEGER NOT NULL, reason TEXT NOT NULL,
  PRIMARY KEY (job, partition, record_offset)
);
CREATE TABLE IF NOT EXISTS kb_leases (
  job TEXT NOT NULL, partition INTEGER NOT NULL, owner TEXT NOT NULL, lease INTEGER NOT NULL,
  PRIMARY KEY (job, partition)
);
CREATE TABLE IF NOT EXISTS kb_publication (
  job TEXT PRIMARY KEY, published_epoch INTEGER, visible_epoch INTEGER
);
CREATE TABLE IF NOT EXISTS kb_pending_units (
  unit INTEGER PRIMARY KEY, job TEXT NOT NULL, epoch INTEGER NOT NULL, partitions TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kb_schema_history (
  job TEXT NOT NULL, version INTEGER NOT NULL, from_epoch INTEGER NOT NULL, fingerprint TEXT NOT NULL,
  row_schema TEXT NOT NULL, applied_epoch INTEGER, PRIMARY KEY (job, version)
);
CREATE TABLE IF NOT EXISTS kb_job_tables (
  table_name TEXT PRIMARY KEY, job TEXT NOT NULL, log_table INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS kb_pending_rows (
  unit INTEGER NOT NULL, seq INTEGER NOT NULL, vnode INTEGER NOT NULL, key BLOB NOT NULL, row BLOB,
  PRIMARY KEY (unit, seq)
) WITHOUT ROWID;
