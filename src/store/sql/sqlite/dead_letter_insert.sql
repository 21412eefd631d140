INSERT OR IGNORE INTO kb_dead_letters VALUES (?1, ?2, ?3, ?4, ?5, ?6)
