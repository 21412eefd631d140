DELETE FROM kb_vnode_progress WHERE job = $1
