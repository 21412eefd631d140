DELETE FROM "{table}" WHERE _kb_vnode = ANY($1::int[])
