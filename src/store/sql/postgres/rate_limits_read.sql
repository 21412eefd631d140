SELECT snapshot_rows_per_second, log_records_per_second FROM kb_rate_limits WHERE job = $1
