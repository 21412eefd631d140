DELETE FROM "{table}" WHERE _kb_vnode = ?1 AND _kb_key = ?2
