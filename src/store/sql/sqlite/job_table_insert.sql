INSERT OR IGNORE INTO kb_job_tables VALUES (?1, ?2, ?3)
