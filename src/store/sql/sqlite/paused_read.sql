SELECT paused FROM kb_job_control WHERE job = ?1
