INSERT INTO "{table}" (_kb_key, _kb_vnode, _kb_row, {columns}) VALUES {tuples} ON CONFLICT {conflict} DO UPDATE SET {set_vnode}_kb_row = EXCLUDED._kb_row, {sets}
