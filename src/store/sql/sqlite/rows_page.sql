SELECT _kb_vnode, _kb_key, _kb_row FROM "{table}" WHERE (_kb_vnode, _kb_key) > (?1, ?2) ORDER BY _kb_vnode, _kb_key LIMIT {limit}
