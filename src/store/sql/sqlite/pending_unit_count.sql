SELECT COUNT(*) FROM kb_pending_units WHERE job = ?1
