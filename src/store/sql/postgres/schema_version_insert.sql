INSERT INTO kb_schema_history VALUES ($1, $2, $3, $4, $5, $6)
