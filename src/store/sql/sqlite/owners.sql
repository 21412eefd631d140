SELECT partition, owner FROM kb_leases WHERE job = ?1
