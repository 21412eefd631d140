SELECT owner, lease FROM kb_leases WHERE job = ?1 AND partition = ?2
