SELECT next_offset, epoch, streaming FROM kb_partition_progress WHERE job = ?1 AND partition = ?2
