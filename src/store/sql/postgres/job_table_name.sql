SELECT table_name FROM kb_jobs WHERE job = $1
