INSERT INTO kb_pending_rows SELECT $1::bigint, * FROM UNNEST($2::int[], $3::int[], $4::bytea[], $5::bytea[])
