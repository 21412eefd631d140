UPDATE kb_jobs SET snapshot_epoch = ?2 WHERE job = ?1
