SELECT vnode_count FROM kb_jobs WHERE job = ?1
