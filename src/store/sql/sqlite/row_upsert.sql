INSERT OR REPLACE INTO "{table}" (_kb_key, _kb_vnode, {datum}{columns}) VALUES (?1, ?2, {datum_mark}{marks})
