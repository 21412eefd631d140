INSERT INTO kb_dead_letters VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (job, partition, record_offset) DO NOTHING
