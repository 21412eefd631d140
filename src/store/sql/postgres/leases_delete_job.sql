DELETE FROM kb_leases WHERE job = $1
