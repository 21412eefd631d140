CREATE TABLE IF NOT EXISTS "{table}" (_kb_key BLOB NOT NULL, _kb_vnode INTEGER NOT NULL, {columns}{datum}, PRIMARY KEY (_kb_vnode, _kb_key)) WITHOUT ROWID;
