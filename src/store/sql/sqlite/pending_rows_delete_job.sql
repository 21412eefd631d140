DELETE FROM kb_pending_rows WHERE unit IN (SELECT unit FROM kb_pending_units WHERE job = ?1)
