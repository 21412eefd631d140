UPDATE kb_jobs SET next_lease = next_lease + 1 WHERE job = ?1 RETURNING next_lease - 1
