INSERT INTO kb_pending_rows VALUES (?1, ?2, ?3, ?4, ?5)
