SELECT row_schema FROM kb_schema_history WHERE job = ?1 ORDER BY version DESC LIMIT 1
