SELECT vnode, key, row FROM kb_pending_rows WHERE unit = ?1 ORDER BY seq
