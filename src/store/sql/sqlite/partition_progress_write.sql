INSERT OR REPLACE INTO kb_partition_progress VALUES (?1, ?2, ?3, ?4, ?5)
