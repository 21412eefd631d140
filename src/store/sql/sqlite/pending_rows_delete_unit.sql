DELETE FROM kb_pending_rows WHERE unit = ?1
