TRUNCATE "{stage}"
