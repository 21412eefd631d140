SELECT _kb_vnode, _kb_key, _kb_row FROM "{table}"
