SELECT partition, owner, lease FROM kb_leases WHERE job = $1 AND partition = ANY($2)
