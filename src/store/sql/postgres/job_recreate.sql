UPDATE kb_jobs SET generation = generation + 1, recreations = recreations + 1, phase = 'snapshot' WHERE job = $1
