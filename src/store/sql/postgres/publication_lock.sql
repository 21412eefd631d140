SELECT 1 FROM kb_publication WHERE job = $1 FOR UPDATE
