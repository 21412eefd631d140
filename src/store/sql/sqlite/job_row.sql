SELECT snapshot_epoch, vnode_count, partition_count, generation, phase, recreations FROM kb_jobs WHERE job = ?1
