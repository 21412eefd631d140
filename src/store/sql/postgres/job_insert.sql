INSERT INTO kb_jobs VALUES ($1, $2, $3, $4, 0, 'snapshot', 0, 1, $5) ON CONFLICT (job) DO NOTHING
