SELECT COALESCE(SUM(name = '_kb_vnode'), 0) > 0, COALESCE(SUM(name = '_kb_row'), 0) > 0 FROM pragma_table_info(?1)
