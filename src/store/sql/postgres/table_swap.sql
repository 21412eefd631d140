DROP TABLE IF EXISTS "{table}"; ALTER TABLE "{next}" RENAME TO "{table}";
