DELETE FROM "{table}" WHERE _kb_vnode = ?1
