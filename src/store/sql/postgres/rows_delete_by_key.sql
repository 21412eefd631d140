DELETE FROM "{table}" WHERE _kb_key = ANY($1)
