SELECT job FROM kb_jobs WHERE table_name = ?1 UNION SELECT job FROM kb_job_tables WHERE table_name = ?1
