SELECT table_name, log_table FROM kb_job_tables WHERE job = $1
