INSERT OR IGNORE INTO kb_jobs VALUES (?1, ?2, ?3, ?4, 0, 'snapshot', 0, 1, ?5)
