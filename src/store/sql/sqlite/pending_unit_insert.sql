INSERT INTO kb_pending_units (job, epoch, partitions) VALUES (?1, ?2, ?3)
