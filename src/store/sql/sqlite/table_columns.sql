SELECT _kb_key, {columns} FROM "{table}"
