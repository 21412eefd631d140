INSERT INTO kb_partition_progress VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, epoch = EXCLUDED.epoch, streaming = EXCLUDED.streaming
