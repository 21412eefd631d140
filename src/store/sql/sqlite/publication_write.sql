INSERT OR REPLACE INTO kb_publication VALUES (?1, ?2, ?3)
