INSERT INTO kb_job_tables VALUES ($1, $2, $3) ON CONFLICT (table_name) DO NOTHING
