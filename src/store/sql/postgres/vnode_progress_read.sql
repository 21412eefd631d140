SELECT vnode, epoch, row_count, finished, cursor FROM kb_vnode_progress WHERE job = $1 AND vnode = ANY($2)
