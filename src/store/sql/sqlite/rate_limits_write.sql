INSERT OR REPLACE INTO kb_rate_limits VALUES (?1, ?2, ?3)
