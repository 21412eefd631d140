UPDATE "{table}" SET _kb_row = $3{sets} WHERE _kb_vnode = $1 AND _kb_key = $2
