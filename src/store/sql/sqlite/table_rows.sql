SELECT _kb_key, _kb_row FROM "{table}"
