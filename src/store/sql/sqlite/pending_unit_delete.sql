DELETE FROM kb_pending_units WHERE unit = ?1
