SELECT COUNT(*) FROM kb_dead_letters WHERE job = $1
