SELECT version, fingerprint FROM kb_schema_history WHERE job = $1 ORDER BY version DESC LIMIT 1
