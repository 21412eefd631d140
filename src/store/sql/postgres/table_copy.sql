COPY "{table}" (_kb_key, _kb_vnode, _kb_row, {columns}) FROM STDIN (FORMAT binary)
