INSERT INTO kb_job_control VALUES ($1, $2) ON CONFLICT (job) DO UPDATE SET paused = EXCLUDED.paused
