DELETE FROM kb_partition_progress WHERE job = $1
