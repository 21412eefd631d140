INSERT INTO kb_publication VALUES ($1, $2, $3) ON CONFLICT (job) DO UPDATE SET published_epoch = EXCLUDED.published_epoch, visible_epoch = EXCLUDED.visible_epoch
