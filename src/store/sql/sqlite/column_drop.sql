ALTER TABLE "{table}" DROP COLUMN "{column}"
