DELETE FROM kb_publication WHERE job = ?1
