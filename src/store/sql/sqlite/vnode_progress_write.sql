INSERT OR REPLACE INTO kb_vnode_progress VALUES (?1, ?2, ?3, ?4, ?5, ?6)
