SELECT unit, epoch, partitions FROM kb_pending_units WHERE job = $1 ORDER BY epoch, unit
