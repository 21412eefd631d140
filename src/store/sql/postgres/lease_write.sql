INSERT INTO kb_leases VALUES ($1, $2, $3, $4) ON CONFLICT (job, partition) DO UPDATE SET owner = EXCLUDED.owner, lease = EXCLUDED.lease
