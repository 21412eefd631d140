SELECT partition, record_offset, epoch, generation, reason FROM kb_dead_letters WHERE job = ?1 ORDER BY partition, record_offset
