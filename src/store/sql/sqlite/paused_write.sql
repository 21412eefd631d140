INSERT OR REPLACE INTO kb_job_control VALUES (?1, ?2)
