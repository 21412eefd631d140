INSERT INTO kb_rate_limits VALUES ($1, $2, $3) ON CONFLICT (job) DO UPDATE SET snapshot_rows_per_second = EXCLUDED.snapshot_rows_per_second, log_records_per_second = EXCLUDED.log_records_per_second
